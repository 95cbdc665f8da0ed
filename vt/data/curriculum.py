"""Curriculum: stratify records by difficulty and trace length; select the stage-2 hard subset.

RECIPE, stage 2: "traces of at least 5K tokens, and queries on which a reference model errs in >= 75% of
8 rollouts (pass-rate profiling)". A record is *hard* when both hold:

    trace_tokens(record) >= min_trace_tokens                  (the assistant trace, in tokens)
    error_rate(prompt) = 1 - pass_rate(prompt) >= min_error_rate,  with n(prompt) >= min_rollouts

``pass_rate`` comes from a profiling JSONL file, one line per prompt id::

    {"id": "aime25-3", "pass_rate": 0.125, "n": 8}

(written by the RL profiler). Several traces of one query (multi-path distillation) share the query's
``prompt_id`` (``Record.prompt_id``: ``metadata["prompt_id"]``, else the record id), which is the key looked
up. Prompts absent from the file are handled by an explicit policy: ``"error"`` (default: a missing id is
usually a join bug), ``"exclude"`` or ``"include"`` (treated as hard on the pass-rate criterion).

Trace length: ``metadata["trace_length"]`` when present (trusted, e.g. measured by the generator), else
the token count of the assistant turns' contents with the given tokenizer.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from vt import VtError
from vt.data.sources import Malformed, Record
from vt.validation import JsonError, load_json

MISSING_POLICIES = ("error", "exclude", "include")


@dataclasses.dataclass(frozen=True)
class PassRate:
    pass_rate: float
    n: int

    @property
    def error_rate(self) -> float:
        return 1.0 - self.pass_rate


def load_pass_rates(path: str | os.PathLike) -> dict[str, PassRate]:
    """Read a profiling JSONL file into ``{prompt_id: PassRate}``; errors name ``file:line``.

    Rejected: malformed JSON, missing ``id``/``pass_rate``/``n``, ``pass_rate`` outside [0, 1] or not
    finite, ``n`` < 1, ``pass_rate * n`` not (close to) an integer count, duplicate ids.
    """
    path = str(path)
    if not os.path.isfile(path):
        raise VtError(f"{path}: profiling file not found")
    out: dict[str, PassRate] = {}
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            try:
                obj = load_json(raw.decode("utf-8"))
            except (UnicodeDecodeError, JsonError) as e:
                raise VtError(f"{where}: not a JSON line: {e}") from None
            if not isinstance(obj, dict) or not all(k in obj for k in ("id", "pass_rate", "n")):
                raise VtError(f"{where}: expected {{\"id\": ..., \"pass_rate\": float, \"n\": int}}, got {raw[:200]!r}")
            pid, p, n = str(obj["id"]), obj["pass_rate"], obj["n"]
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p <= 1.0:
                raise VtError(f"{where}: pass_rate {p!r} is not a number in [0, 1]")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise VtError(f"{where}: n {n!r} must be a positive integer (rollouts per prompt)")
            if abs(p * n - round(p * n)) > 1e-6:
                raise VtError(f"{where}: pass_rate {p} is not k/{n} for an integer k")
            if pid in out:
                raise VtError(f"{where}: duplicate id {pid!r} (first at line {first_line[pid]})")
            out[pid] = PassRate(float(p), n)
            first_line[pid] = lineno
    return out


def token_trace_length(tokenizer) -> Callable[[Record], int]:
    """Trace length = ``metadata["trace_length"]`` if recorded, else tokens in the assistant contents."""

    def length(record: Record) -> int:
        if "trace_length" in record.metadata:
            return int(record.metadata["trace_length"])
        if record.input_ids is not None:
            return int(sum(record.loss_mask))
        return sum(len(tokenizer.encode(m["content"])) for m in record.messages if m["role"] == "assistant")

    return length


@dataclasses.dataclass
class SelectionReport:
    """Why records were or were not selected (counts), plus up to 5 example ids of missing prompts."""

    total: int = 0
    selected: int = 0
    malformed: int = 0
    too_short: int = 0
    too_easy: int = 0
    missing_pass_rate: int = 0
    too_few_rollouts: int = 0
    missing_examples: list[str] = dataclasses.field(default_factory=list)


def select_hard_subset(source: Sequence[Record | Malformed], pass_rates: dict[str, PassRate], *,
                       trace_length: Callable[[Record], int], min_trace_tokens: int = 5000,
                       min_error_rate: float = 0.75, min_rollouts: int = 8,
                       missing: str = "error") -> tuple[list[int], SelectionReport]:
    """Indices of the stage-2 hard subset of ``source`` (see the module docstring), with a report.

    Wrap the result as ``SubsetSource(source, indices)`` to train on it. ``min_rollouts``: pass rates
    measured on fewer rollouts are too noisy to trust and count as ``too_few_rollouts`` (not selected).
    Malformed items are not selected and are counted (the training pipeline reports them in detail).
    """
    if missing not in MISSING_POLICIES:
        raise VtError(f"missing={missing!r}: expected one of {MISSING_POLICIES}")
    report = SelectionReport(total=len(source))
    selected = []
    for i in range(len(source)):
        rec = source[i]
        if isinstance(rec, Malformed):
            report.malformed += 1
            continue
        pr = pass_rates.get(rec.prompt_id)
        if pr is None:
            if missing == "error":
                raise VtError(f"{rec.where or rec.id}: prompt id {rec.prompt_id!r} has no pass rate in the profiling "
                              f"file (set missing='exclude' or 'include' to proceed)")
            report.missing_pass_rate += 1
            if len(report.missing_examples) < 5:
                report.missing_examples.append(rec.prompt_id)
            if missing == "exclude":
                continue
        elif pr.n < min_rollouts:
            report.too_few_rollouts += 1
            continue
        elif pr.error_rate < min_error_rate - 1e-12:  # 6/8 errors = 0.75 must pass a 0.75 threshold
            report.too_easy += 1
            continue
        if trace_length(rec) < min_trace_tokens:
            report.too_short += 1
            continue
        selected.append(i)
    report.selected = len(selected)
    return selected, report


def bucket_of(value: float | None, edges: Sequence[float]) -> int:
    """Bucket index for ``value`` with ascending ``edges``: bucket k holds ``edges[k-1] <= v < edges[k]``
    (bucket 0 is below ``edges[0]``, bucket len(edges) at or above the last edge); -1 when value is None."""
    if value is None:
        return -1
    return bisect.bisect_right(list(edges), value)


def stratify(source: Sequence[Record | Malformed], *, difficulty_edges: Sequence[float],
             length_edges: Sequence[float], trace_length: Callable[[Record], int],
             difficulty: Callable[[Record], float | None] | None = None) -> dict[tuple[int, int], list[int]]:
    """Group record indices into (difficulty bucket, trace-length bucket) cells (see :func:`bucket_of`).

    ``difficulty`` defaults to ``metadata["difficulty"]``, else the error rate ``1 - metadata["pass_rate"]``,
    else unknown (bucket -1). Malformed items are left out. Use the cells to order or re-weight the
    curriculum (e.g. easy/short first in stage 1) or to report the data mix.
    """
    for name, edges in (("difficulty_edges", difficulty_edges), ("length_edges", length_edges)):
        if list(edges) != sorted(edges):
            raise VtError(f"{name} must be ascending, got {list(edges)}")
    difficulty = difficulty or default_difficulty
    cells: dict[tuple[int, int], list[int]] = {}
    for i in range(len(source)):
        rec = source[i]
        if isinstance(rec, Malformed):
            continue
        key = (bucket_of(difficulty(rec), difficulty_edges), bucket_of(trace_length(rec), length_edges))
        cells.setdefault(key, []).append(i)
    return dict(sorted(cells.items()))


def default_difficulty(record: Record) -> float | None:
    md: dict[str, Any] = record.metadata
    if md.get("difficulty") is not None:
        return float(md["difficulty"])
    if md.get("pass_rate") is not None:
        return 1.0 - float(md["pass_rate"])
    return None
