"""Offline self-distillation (RECIPE stage 4): S_LP scoring by the student, band selection, domain mix."""
from vt.distill.selection import DomainRule, ScoredTrace, band_select, select  # noqa: F401
