"""Evaluation: pass@1 (avg@n), unbiased pass@k, maj@k (cons@n), the benchmark runner, CLR test-time scaling."""
