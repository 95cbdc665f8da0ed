"""Data construction around the stages (RECIPE): quality filters, dedup, decontamination, teacher query
expansion and multi-path distillation with verification, curriculum stratification. CLI: `vt data ...`."""
