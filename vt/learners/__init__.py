"""`vt train` and the learners it runs (registry.LEARNERS); the package itself imports nothing, so that registering
the command imports no learner."""
