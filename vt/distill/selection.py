"""Which verified traces the student is distilled on (RECIPE stage 4), from their S_LP scores.

Per domain, separately (math traces are longer and less likely than chat, so global ranks would mix
length and domain effects into the score):
  1. drop traces shorter than the domain's ``min_tokens`` (reason ``too_short``);
  2. bucket the rest by length with the domain's ascending ``length_edges`` (bucket k holds
     ``edges[k-1] <= length < edges[k]``), and rank each bucket by S_LP ascending (ties by trace id);
  3. with N traces in a bucket, keep ranks r with ``floor(band_lo * N) <= r < floor(band_hi * N)``: the
     middle-to-high band. Ranks at or above ``floor(band_hi * N)`` are the extreme high-NLL outliers
     (``high_outlier``: what the student finds implausible, often garbled or off-distribution); ranks
     below ``floor(band_lo * N)`` are traces it already predicts well (``low_score``: little to learn).
Then domains are mixed: each domain contributes ``round(weight_d / sum(weights) * total)`` of its kept
traces (a seeded shuffle picks which; ``total = 0`` keeps every kept trace), and a domain with fewer kept
traces than its share gives what it has (the report says so).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Annotated

import numpy as np

from vt import VtError
from vt.validation import AT_LEAST_1, FRACTION, NON_NEGATIVE, check_fields


@dataclasses.dataclass(frozen=True)
class DomainRule:
    min_tokens: Annotated[int, NON_NEGATIVE] = 0  # traces shorter than this are dropped
    length_edges: Annotated[tuple[int, ...], AT_LEAST_1] = ()  # ascending bucket edges in tokens
    band_lo: Annotated[float, FRACTION] = 0.3  # keep ranks from floor(band_lo * N) ...
    band_hi: Annotated[float, FRACTION] = 0.95  # ... up to (not including) floor(band_hi * N)
    weight: Annotated[float, NON_NEGATIVE] = 1.0  # share of the mixed data set

    def __post_init__(self):
        check_fields(self)

    def check(self, domain: str) -> None:
        if list(self.length_edges) != sorted(self.length_edges):
            raise VtError(f"selection.rules.{domain}.length_edges must be ascending, got {self.length_edges}")
        if not 0.0 <= self.band_lo < self.band_hi <= 1.0:
            raise VtError(f"selection.rules.{domain}: need 0 <= band_lo < band_hi <= 1, got "
                          f"{self.band_lo}, {self.band_hi}")


@dataclasses.dataclass(frozen=True)
class ScoredTrace:
    id: str
    domain: str
    length: int  # completion tokens
    score: float  # S_LP


def band_select(traces: Sequence[ScoredTrace], rule: DomainRule) -> tuple[list[ScoredTrace], dict[str, list[str]]]:
    """Steps 1-3 for one domain's traces: (kept, {reason: [ids]})."""
    dropped: dict[str, list[str]] = {"too_short": [], "low_score": [], "high_outlier": []}
    buckets: dict[int, list[ScoredTrace]] = {}
    for t in traces:
        if not math.isfinite(t.score):
            raise VtError(f"trace {t.id}: S_LP is {t.score}")
        if t.length < rule.min_tokens:
            dropped["too_short"].append(t.id)
            continue
        buckets.setdefault(bisect.bisect_right(list(rule.length_edges), t.length), []).append(t)
    kept = []
    for _, items in sorted(buckets.items()):
        items = sorted(items, key=lambda t: (t.score, t.id))
        N = len(items)
        lo, hi = math.floor(rule.band_lo * N), math.floor(rule.band_hi * N)
        dropped["low_score"] += [t.id for t in items[:lo]]
        dropped["high_outlier"] += [t.id for t in items[hi:]]
        kept += items[lo:hi]
    return kept, dropped


def select(traces: Sequence[ScoredTrace], rules: Mapping[str, DomainRule], total: int = 0,
           seed: int = 0) -> tuple[list[ScoredTrace], dict]:
    """Band selection per domain, then the domain mix. Returns (selected traces, report)."""
    by_domain: dict[str, list[ScoredTrace]] = {}
    for t in traces:
        by_domain.setdefault(t.domain, []).append(t)
    missing = sorted(set(by_domain) - set(rules))
    if missing:
        raise VtError(f"selection.rules: no rule for domain(s) {missing}")
    for d, r in rules.items():
        r.check(d)
    report: dict = {"domains": {}}
    kept_by_domain = {}
    for d in sorted(by_domain):
        kept, dropped = band_select(by_domain[d], rules[d])
        kept_by_domain[d] = kept
        report["domains"][d] = {"traces": len(by_domain[d]), "in_band": len(kept),
                                **{k: len(v) for k, v in dropped.items()}}
    weights = {d: rules[d].weight for d in kept_by_domain}
    wsum = sum(weights.values())
    rng = np.random.default_rng(seed)
    out = []
    for d, kept in kept_by_domain.items():
        want = len(kept) if total == 0 else round(weights[d] / wsum * total) if wsum > 0 else 0
        take = min(want, len(kept))
        picks = sorted(rng.permutation(len(kept))[:take]) if take < len(kept) else range(len(kept))
        out += [kept[i] for i in picks]
        report["domains"][d].update(wanted=want, selected=take, short_by=want - take)
    report["selected"] = len(out)
    return out, report
