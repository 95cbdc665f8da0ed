"""Offline self-distillation (RECIPE stage 4): S_LP scoring by the student (scoring), band selection and the
domain mix (selection), the resumable run (run). Import names from their modules (see vt/checkpoint/__init__.py)."""
