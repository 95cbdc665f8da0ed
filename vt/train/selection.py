"""Diversity-Exploring Distillation (RECIPE stages 1-2): score saved checkpoints by Pass@K on per-domain probing
sets, pick the best checkpoint per domain, merge the specialists at the parameter level.

    report = select_and_merge(step_dirs, scorer, out_dir)  # scorer(ckpt) -> {domain: score}; vt.train.merge

The recipe's select stage (vt.recipe.stages.run_select) samples each probe n times with vt.sampling's Engine,
verifies the samples with vt.rewards and scores a domain by `mean_pass_at_k`. Unbiased pass@k (Chen et al.
2021) from n samples of which c are correct:
    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)     (1 when n - c < k)
Selection is by pass@k, not loss and not pass@1: the report picks checkpoints that still explore many
solution paths. The merge is a uniform average over the domain specialists (the 1.5B report): a checkpoint
that wins d of D domains gets weight d / D.
"""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vt import VtError
from vt.eval.metrics import pass_at_k
from vt.train.merge import merge_checkpoints


def mean_pass_at_k(valid_QN: np.ndarray, correct_QN: np.ndarray, k: int) -> float:
    """Mean over probes of pass@min(k, v) from each probe's v valid (verifier-judged) samples, c of them correct;
    probes without a valid sample are left out (0.0 when none has one)."""
    per = [pass_at_k(int(valid_QN[q].sum()), int(correct_QN[q].sum()), min(k, int(valid_QN[q].sum())))
           for q in range(len(valid_QN)) if valid_QN[q].any()]
    return sum(per) / max(1, len(per))


def score_checkpoints(ckpt_dirs: Sequence[Path | str],
                      scorer: Callable[[Path], Mapping[str, float]]) -> dict[Path, dict[str, float]]:
    """{checkpoint: {domain: score}}; `scorer` loads and scores one checkpoint (one in memory at a time)."""
    scores = {Path(d): dict(scorer(Path(d))) for d in ckpt_dirs}
    domains = {frozenset(s) for s in scores.values()}
    if len(domains) != 1:
        raise VtError(f"checkpoint scores cover different domains: {sorted(map(sorted, domains))}")
    return scores


def best_per_domain(scores: Mapping[Path, Mapping[str, float]]) -> dict[str, Path]:
    """The highest-scoring checkpoint per domain; ties go to the later checkpoint in `scores`' order (more
    training at equal pass@k)."""
    if not scores:
        raise VtError("no checkpoints to choose from")
    domains = next(iter(scores.values())).keys()
    best = {}
    for d in domains:
        best[d] = max(reversed(list(scores)), key=lambda c: scores[c][d])
    return best


def specialist_weights(chosen: Mapping[str, Path]) -> tuple[list[Path], list[float]]:
    counts = collections.Counter(chosen.values())
    ckpts = sorted(counts, key=str)
    return ckpts, [counts[c] / len(chosen) for c in ckpts]


def select_and_merge(ckpt_dirs: Sequence[Path | str], scorer: Callable[[Path], Mapping[str, float]],
            out_dir: Path | str) -> dict[str, Any]:
    """Score, choose per domain, merge into `out_dir`. Returns {"scores", "chosen", "weights"}."""
    scores = score_checkpoints(ckpt_dirs, scorer)
    chosen = best_per_domain(scores)
    ckpts, weights = specialist_weights(chosen)
    merge_checkpoints(ckpts, out_dir, weights)
    return {"scores": {str(c): s for c, s in scores.items()}, "chosen": {d: str(c) for d, c in chosen.items()},
            "weights": {str(c): w for c, w in zip(ckpts, weights)}}
