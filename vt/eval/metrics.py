"""Evaluation metrics: avg@n pass@1, unbiased pass@k, majority vote (maj@k / cons@n), truncation, length.

All are small pure functions over per-sample values; the benchmark runner applies them per problem and
averages over problems.

pass@k (Chen et al. 2021), unbiased from n samples of which c are correct:

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)      (= 1 when n - c < k)

The product form never builds a binomial coefficient (C(64, 32) ~ 1.8e18 overflows float precision
long before the ratio does) and is exact to float rounding.

avg@n (the "Pass@1" of the reports): mean correctness over the n samples = pass@1 with k = 1.

Majority vote. ``maj@k`` of a problem is the correctness of the answer most of its *first k* samples
(in sample order) agree on; ``cons@n`` is ``maj@n``. Answers are grouped into clusters
(:func:`cluster_answers`: same normalised string, or equivalent under a supplied checker). Policy:
  - a sample without an extracted answer (None) does not vote; a problem where no sample answers scores 0;
  - tie between clusters with equal votes: the cluster whose first member comes earliest in sample
    order wins (deterministic, and it favours what the model produced first, with no look at the gold);
  - the winning cluster is correct when its first member is correct.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from vt import VtError


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from n samples with c correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise VtError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def avg_at_n(correct: Sequence[bool | float]) -> float:
    """Mean correctness over the samples (pass@1 estimated with all n)."""
    if len(correct) == 0:
        raise VtError("avg@n of zero samples")
    return float(np.mean(np.asarray(correct, dtype=np.float64)))


def normalize_answer(answer: str) -> str:
    """The exact-match key: whitespace removed (``\\frac{1}{2}`` and ``\\frac {1} {2}`` are one answer)."""
    return "".join(answer.split())


def cluster_answers(answers: Sequence[str | None],
                    equivalent: Callable[[str, str], bool] | None = None) -> list[int | None]:
    """Cluster id per answer (None stays None), ids numbered by first appearance.

    Answers with the same :func:`normalize_answer` key always share a cluster; with ``equivalent``, a new
    key joins the first existing cluster whose representative (its first answer) it is equivalent to,
    compared as ``equivalent(representative, answer)``. Cost: one call per (new key, cluster) pair.
    """
    key_to_cluster: dict[str, int] = {}
    reps: list[str] = []
    out: list[int | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        key = normalize_answer(a)
        if key not in key_to_cluster:
            found = None
            if equivalent is not None:
                found = next((c for c, rep in enumerate(reps) if equivalent(rep, a)), None)
            if found is None:
                found = len(reps)
                reps.append(a)
            key_to_cluster[key] = found
        out.append(key_to_cluster[key])
    return out


def weighted_vote(clusters: Sequence[int | None], weights: Sequence[float] | None = None) -> int | None:
    """Index of the sample that leads the winning cluster (None when no sample has a cluster).

    Score of a cluster = sum of its members' weights (1 each by default). Ties on score go to the cluster
    with more members (plain majority among the tied: matters for weighted votes, e.g. CLR when every
    reliability is 0), then to the cluster whose first member comes first. Returns the *sample index* of
    the winning cluster's first member.
    """
    if weights is not None and len(weights) != len(clusters):
        raise VtError(f"vote: {len(clusters)} answers but {len(weights)} weights")
    score: dict[int, float] = {}
    count: dict[int, int] = {}
    first: dict[int, int] = {}
    for i, c in enumerate(clusters):
        if c is None:
            continue
        score[c] = score.get(c, 0.0) + (1.0 if weights is None else float(weights[i]))
        count[c] = count.get(c, 0) + 1
        first.setdefault(c, i)
    if not score:
        return None
    best = max(score, key=lambda c: (score[c], count[c], -first[c]))
    return first[best]


def maj_at_k(clusters: Sequence[int | None], correct: Sequence[bool], k: int) -> float:
    """1.0 when the majority cluster of the first k samples is correct, else 0.0 (policy in module doc)."""
    if not 1 <= k <= len(clusters) or len(correct) != len(clusters):
        raise VtError(f"maj@k needs 1 <= k <= n = {len(clusters)} (and one correctness per sample), got k={k}")
    winner = weighted_vote(clusters[:k])
    return 0.0 if winner is None else float(bool(correct[winner]))


def truncation_rate(finish_reasons: Sequence[str]) -> float:
    """Fraction of samples that ran out of tokens (finish_reason "length")."""
    if len(finish_reasons) == 0:
        raise VtError("truncation rate of zero samples")
    return float(np.mean([r == "length" for r in finish_reasons]))


def mean_length(num_tokens: Sequence[int]) -> float:
    if len(num_tokens) == 0:
        raise VtError("mean length of zero samples")
    return float(np.mean(np.asarray(num_tokens, dtype=np.float64)))


def problem_metrics(correct: Sequence[bool], clusters: Sequence[int | None], finish_reasons: Sequence[str],
                    num_tokens: Sequence[int], ks: Sequence[int], maj_ks: Sequence[int]) -> dict[str, float]:
    """All per-problem metrics in one dict (keys ``avg@n``, ``pass@K``, ``maj@K``, ``truncated``,
    ``mean_tokens``). ks / maj_ks larger than the number of samples are skipped (the summary names them)."""
    n, c = len(correct), int(sum(bool(x) for x in correct))
    out = {"avg@n": avg_at_n(correct)}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = pass_at_k(n, c, k)
    for k in maj_ks:
        if k <= n:
            out[f"maj@{k}"] = maj_at_k(clusters, correct, k)
    out["truncated"] = truncation_rate(finish_reasons)
    out["mean_tokens"] = mean_length(num_tokens)
    return out


def mean_over_problems(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the problems that have it; ``problems`` = how many."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {"problems": len(rows), **{k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}}
