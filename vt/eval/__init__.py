"""Evaluation: pass@1 (avg@n), unbiased pass@k, maj@k (cons@n), the benchmark runner, CLR test-time scaling."""
from vt.eval.metrics import avg_at_n, cluster_answers, maj_at_k, pass_at_k, weighted_vote  # noqa: F401
