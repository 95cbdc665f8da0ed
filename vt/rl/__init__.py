"""On-policy RL (MGPO): objective functions and the learner."""
