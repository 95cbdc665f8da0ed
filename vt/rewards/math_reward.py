"""Math reward: the last ``\\boxed{}`` of the answer, checked by math-verify in killable worker processes.

Pipeline per item (host side, cheap and bounded):
  1. the answer region: text after the last ``</think>``, then only its last ``tail_chars`` characters;
  2. every complete ``\\boxed{...}`` in it, by balanced-brace scan (``\\{``/``\\}`` are literal braces);
  3. the hedging policy (below);
  4. ``verify(gold, pred)`` (gold first) in a worker process with a hard deadline (workers.py).

Hedging policy (explicit, scores 0 with failure "format" and ``details["hedged"]``):
  - two or more *different* boxed answers in the answer region (``\\boxed{3} or \\boxed{5}``); the same
    answer boxed twice is fine;
  - one box listing several candidates at top level (``3, 5``, ``3; 5``, ``3 or 5``, ``3 \\text{ or } 5``,
    ``3 and 5``) while the ground truth is a single value. When the ground truth is itself a list (a set
    of solutions), the comparison is left to math-verify, which compares sets.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from vt.rewards.base import (
    RewardFunction,
    RewardResult,
    RewardSpecError,
    answer_region,
    clip,
    failed,
    field,
    map_bounded,
    passed,
    verifier_error,
)
from vt.rewards.workers import WorkerError, WorkerPool

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in order (outermost boxes only).

    Linear time; an unbalanced box (a truncated generation, a million ``{``) is skipped, not an error.
    """
    out: list[str] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        end = _matching_brace(text, m.end())
        if end is None:
            pos = m.end()  # unbalanced: maybe a later box is complete
            continue
        out.append(text[m.end() : end])
        pos = end + 1


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the group opened just before ``start``; None if it never closes."""
    depth = 1
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # \{ \} \\ are not grouping braces
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


_OPEN, _CLOSE = "([{", ")]}"
_SEPARATOR_RE = re.compile(r"\s*(?:,|;|\\text\{\s*(?:or|and)\s*\}|\\(?:q)?quad|\bor\b|\band\b)\s*")
_THOUSANDS_RE = re.compile(r"^\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?$")


def top_level_items(answer: str) -> list[str]:
    """Split an answer at top-level separators (commas, semicolons, "or"/"and", \\quad) outside brackets.

    ``(1, 2)``, ``\\{1, 2\\}``, ``f(1, 2)`` and ``1,000`` stay one item.
    """
    s = answer.strip()
    if _THOUSANDS_RE.match(s):  # "1,000" is a number; "469, 468" (with a space) is a list
        return [s]
    items, depth, last, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0:
            m = _SEPARATOR_RE.match(s, i)
            if m:
                if s[last:i].strip():
                    items.append(s[last:i].strip())
                last = i = m.end()
                continue
        i += 1
    if s[last:].strip():
        items.append(s[last:].strip())
    return items


def hedge_reason(boxes: list[str], gold: str) -> str | None:
    """Why this set of boxed answers is a hedge, or None if it is a single committed answer."""
    distinct = list(dict.fromkeys(re.sub(r"\s+", "", b) for b in boxes))
    if len(distinct) > 1:
        return f"{len(distinct)} different boxed answers"
    items = top_level_items(boxes[-1])
    if len(items) > 1 and len(top_level_items(gold)) == 1:
        return f"one box lists {len(items)} candidates for a single-valued answer"
    return None


@dataclasses.dataclass(frozen=True)
class MathConfig:
    workers: int = 2  # math-verify worker processes = concurrent verifications
    deadline_s: float = 15.0  # hard wall-clock limit per item; the worker is killed beyond it
    verify_timeout_s: int = 4  # math-verify's own SIGALRM timeout per parse/verify call inside the worker
    tail_chars: int = 2000  # only this many trailing characters of the answer region are scored
    worker_memory_mb: int = 2048  # address-space cap of a worker (huge sympy integers hit it, not the host)
    startup_timeout_s: float = 120.0  # a worker's imports (sympy, antlr) on a loaded machine

    def __post_init__(self):
        if self.deadline_s <= 0 or self.verify_timeout_s < 1 or self.tail_chars < 16 or self.workers < 1:
            raise ValueError(f"invalid MathConfig: {self}")


def ground_truth_text(value: Any, index: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RewardSpecError(
            f"record {index}: field 'ground_truth' must be an int, float or string, got {type(value).__name__}"
        )
    text = str(value).strip()
    if not text:
        raise RewardSpecError(f"record {index}: field 'ground_truth' is empty")
    return text


class MathReward(RewardFunction):
    """1 if the last boxed answer equals the ground truth under math-verify, else 0 (or a verifier error)."""

    domain = "math"
    streams = True  # score_batch maps score_one over the items

    @property
    def workers(self) -> int:
        return self.config.workers

    def __init__(self, config: MathConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or MathConfig(), **overrides)
        args = ["--memory-mb", str(self.config.worker_memory_mb)]
        self.pool = WorkerPool("vt.rewards._math_worker", self.config.workers, self.config.startup_timeout_s, args)

    def reference(self, record: Mapping[str, Any], index: int) -> str:
        return ground_truth_text(field(record, "ground_truth", index), index)

    def score_batch(self, references: list[str], completions: list[str]) -> list[RewardResult]:
        return map_bounded(lambda gc: self.score_one(*gc), list(zip(references, completions)), self.workers)

    def score_one(self, gold: str, completion: str) -> RewardResult:
        boxes = boxed_answers(answer_region(completion, self.config.tail_chars))
        if not boxes:
            return failed("format", reason="no complete \\boxed{} in the answer region")
        answer = boxes[-1]
        reason = hedge_reason(boxes, gold)
        if reason is not None:
            return failed("format", reason=reason, hedged=True, answer=clip(answer))
        return self.verify(gold, answer)

    def verify(self, gold: str, answer: str) -> RewardResult:
        """math-verify on one (gold, predicted answer) pair in a worker, with the hard deadline."""
        request = {"gold": gold, "pred": answer, "timeout_s": self.config.verify_timeout_s}
        try:
            reply = self.pool.call(request, self.config.deadline_s)
        except WorkerError as e:
            return verifier_error(str(e), answer=clip(answer), deadline_s=self.config.deadline_s)
        error = reply.get("error")
        if error == "pred_unparseable":
            return failed("format", reason="math-verify could not parse the answer", answer=clip(answer))
        if error is not None:  # timeout, gold_unparseable, exception: correctness unknown
            return verifier_error(f"{error}: {reply.get('message', '')}", answer=clip(answer))
        details = {"answer": reply.get("pred_parsed", clip(answer)), "ground_truth": reply.get("gold_parsed", gold)}
        return passed(**details) if reply.get("verified") is True else failed("wrong", **details)

    def close(self) -> None:
        self.pool.close()
