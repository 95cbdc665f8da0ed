"""Diversity-Exploring Distillation (RECIPE stages 1-2): score saved checkpoints by Pass@K on per-domain probing
sets, pick the best checkpoint per domain, merge the specialists at the parameter level.

    scores = score_checkpoints(step_dirs, lambda d: pass_at_k_scores(load_model(d), probes, sampler, verify, n, k))
    chosen = best_per_domain(scores)                 # {domain: checkpoint}
    weights = distill(step_dirs, scorer, out_dir)    # all three, then vt.train.merge

Unbiased pass@k (Chen et al. 2021) from n samples of which c are correct:
    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)     (1 when n - c < k)
Selection is by pass@k, not loss and not pass@1: the report picks checkpoints that still explore many
solution paths. The merge is a uniform average over the domain specialists (the 1.5B report): a checkpoint
that wins d of D domains gets weight d / D.

The sampler and the verifier are plain callables, so scoring works with vt.sampling's Engine and the
vt.rewards verifiers, or with any stand-in.
"""
from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from vt import VtError
from vt.eval.metrics import pass_at_k  # noqa: F401 (one implementation, re-exported here)


@dataclasses.dataclass(frozen=True)
class Probe:
    id: str
    domain: str  # e.g. "math", "code", "stem"
    prompt_ids: tuple[int, ...]  # the rendered, tokenised prompt (generation prompt included)
    answer: Any = None  # whatever the verifier needs (ground truth, tests)


# sampler(model, prompts, n) -> for each prompt, n completions (token id lists)
Sampler = Callable[[Any, Sequence[Sequence[int]], int], list[list[list[int]]]]
# verifier(probe, completion_ids) -> correct?
Verifier = Callable[[Probe, list[int]], bool]


def pass_at_k_scores(model, probes: Sequence[Probe], sampler: Sampler, verifier: Verifier, *, n: int,
                     k: int) -> dict[str, float]:
    """Mean pass@k per domain of `model` on `probes` (n samples per probe)."""
    if not probes:
        raise VtError("pass@k scoring: no probing problems")
    completions = sampler(model, [p.prompt_ids for p in probes], n)
    if len(completions) != len(probes) or any(len(c) != n for c in completions):
        raise VtError(f"pass@k scoring: the sampler returned {[len(c) for c in completions]} completions, "
                      f"expected {n} for each of {len(probes)} probes")
    per_domain: dict[str, list[float]] = collections.defaultdict(list)
    for probe, outs in zip(probes, completions):
        correct = sum(bool(verifier(probe, list(o))) for o in outs)
        per_domain[probe.domain].append(pass_at_k(n, correct, k))
    return {d: float(np.mean(v)) for d, v in sorted(per_domain.items())}


def engine_sampler(sampler_config) -> Sampler:
    """A Sampler over vt.sampling's Engine (temperature etc. from `sampler_config`, a SamplerConfig)."""
    def sample(model, prompts, n):
        from vt.sampling.engine import Engine, Request
        out = Engine(model, sampler_config).generate([Request(prompt_ids=list(p), n=n) for p in prompts])
        return [[s.completion_ids for s in per_prompt] for per_prompt in out]
    return sample


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


def distill(ckpt_dirs: Sequence[Path | str], scorer: Callable[[Path], Mapping[str, float]],
            out_dir: Path | str) -> dict[str, Any]:
    """Score, choose per domain, merge into `out_dir`. Returns {"scores", "chosen", "weights"}."""
    from vt.train.merge import merge_checkpoints
    scores = score_checkpoints(ckpt_dirs, scorer)
    chosen = best_per_domain(scores)
    ckpts, weights = specialist_weights(chosen)
    merge_checkpoints(ckpts, out_dir, weights)
    return {"scores": {str(c): s for c, s in scores.items()}, "chosen": {d: str(c) for d, c in chosen.items()},
            "weights": {str(c): w for c, w in zip(ckpts, weights)}}
