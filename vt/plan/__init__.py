"""Compile vt's programs for hardware that is not there (TPU topologies from any host) and size a run before
launching it: `vt plan` (vt.plan.run), the topologies (vt.plan.topology), the abstract program builders shared with
bench/compile.py (vt.plan.programs)."""
