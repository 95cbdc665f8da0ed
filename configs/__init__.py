"""vt's config files (vt.config.load_config imports them as members of this package, so they build on each other
with ordinary imports); configs/common.py holds what they share."""
