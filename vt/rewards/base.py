"""What every reward function shares: the result type, the failure taxonomy and the batch contract.

A reward function maps a batch of (prompt record, completion text) to one ``RewardResult`` per item.
Scores live in [0, 1]. A *verifier error* (the checker itself failed: a hung or crashed math worker, a
sandbox that could not start, a malformed judge reply) has ``score=None`` on purpose: it must be handled
explicitly by the caller (dropped, retried, logged), never averaged in as a silent 0 or summed as NaN.

Dataset errors (a record without its reference, a test case without an expected output, an unknown
constraint type) raise ``RewardSpecError`` naming the record and field before any work starts: they are
bugs in the data, not properties of the completion.
"""
from __future__ import annotations

import abc
import concurrent.futures as cf
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

log = logging.getLogger(__name__)

FailureKind = Literal["wrong", "timeout", "runtime_error", "output_limit", "memory", "format", "verifier_error"]
FAILURE_KINDS: tuple[str, ...] = (
    "wrong",  # a well-formed answer that does not match
    "timeout",  # the program (or the problem's test suite) ran past its time limit
    "runtime_error",  # the program crashed or exited non-zero, or left no result
    "output_limit",  # the program wrote more than the output / file-size cap
    "memory",  # the program ran out of its memory cap
    "format",  # no answer could be extracted (no \boxed{}, no code block, a hedged answer)
    "verifier_error",  # the checker failed; the completion's correctness is unknown (score is None)
)

# Details are logged and written to JSONL: keep any echoed model text short so a megabyte of output
# can never flood a log line or an output file.
DETAIL_CHARS = 200


class RewardSpecError(ValueError):
    """A dataset error: a record lacks its reference or carries a malformed one. Names record and field."""


@dataclasses.dataclass(frozen=True)
class RewardResult:
    """One item's verdict. ``score`` is None exactly when ``failure == "verifier_error"``."""

    score: float | None
    failure: str | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.failure is not None and self.failure not in FAILURE_KINDS:
            raise ValueError(f"failure kind {self.failure!r} is not one of {FAILURE_KINDS}")
        if (self.failure == "verifier_error") != (self.score is None):
            raise ValueError("score must be None exactly for a verifier_error")
        if self.score is not None and not 0.0 <= self.score <= 1.0:
            raise ValueError(f"score {self.score} outside [0, 1]")

    @property
    def is_verifier_error(self) -> bool:
        return self.failure == "verifier_error"

    def to_json(self) -> dict[str, Any]:
        """The two fields `vt reward` adds to a record: ``score`` and ``details`` (with ``failure``)."""
        return {"score": self.score, "details": {"failure": self.failure, **self.details}}


def passed(**details: Any) -> RewardResult:
    return RewardResult(1.0, None, details)


def failed(kind: str, **details: Any) -> RewardResult:
    return RewardResult(0.0, kind, details)


def verifier_error(reason: str, **details: Any) -> RewardResult:
    return RewardResult(None, "verifier_error", {"reason": clip(reason), **details})


def clip(text: str, limit: int = DETAIL_CHARS) -> str:
    """Shorten text for details/logs, keeping both ends (the end of an answer is usually what matters)."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def answer_region(completion: str, tail_chars: int | None = None) -> str:
    """The part of a completion that may hold the final answer.

    Everything after the last ``</think>`` (the whole text when there is none), then only its last
    ``tail_chars`` characters: answers in the reasoning must not count, and bounding the region bounds
    the work any extractor can be made to do.
    """
    _, sep, after = completion.rpartition("</think>")
    region = after if sep else completion
    if tail_chars is not None and len(region) > tail_chars:
        region = region[-tail_chars:]
    return region


def scores_and_mask(results: Sequence[RewardResult]) -> tuple[np.ndarray, np.ndarray]:
    """Scores as float32 with 0 at verifier errors, plus the boolean mask of *valid* items.

    The only sanctioned way to turn results into an array: the caller must look at the mask.
    """
    valid = np.array([not r.is_verifier_error for r in results], dtype=bool)
    scores = np.array([r.score if r.score is not None else 0.0 for r in results], dtype=np.float32)
    return scores, valid


def field(record: Mapping[str, Any], name: str, index: int) -> Any:
    """record[name], with verl's ``reward_model.ground_truth`` accepted for ``ground_truth``."""
    if not isinstance(record, Mapping):
        raise RewardSpecError(f"record {index}: expected an object, got {type(record).__name__}")
    if name in record:
        return record[name]
    if name == "ground_truth" and isinstance(record.get("reward_model"), Mapping):
        if "ground_truth" in record["reward_model"]:
            return record["reward_model"]["ground_truth"]
    raise RewardSpecError(f"record {index}: missing field '{name}'")


def check_completion(completion: Any, index: int) -> None:
    if not isinstance(completion, str):
        raise RewardSpecError(f"record {index}: completion must be a string, got {type(completion).__name__}")


T = TypeVar("T")


def map_bounded(fn: Callable[[T], RewardResult], items: Sequence[T], workers: int) -> list[RewardResult]:
    """fn over items on at most ``workers`` threads, in order.

    The threads only wait (on worker processes, sandboxes or HTTP); nothing untrusted runs in them. An
    unexpected exception in the checker becomes that item's verifier error, logged once per batch.
    """

    def guarded(item: T) -> RewardResult:
        try:
            return fn(item)
        except RewardSpecError:
            raise
        except Exception as e:  # noqa: BLE001 - a checker bug must not pass as a score
            log.warning("reward checker raised %s: %s", type(e).__name__, clip(str(e)))
            return verifier_error(f"checker raised {type(e).__name__}: {e}")

    if workers <= 1 or len(items) <= 1:
        return [guarded(x) for x in items]
    with cf.ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="vt-reward") as ex:
        return list(ex.map(guarded, items))


class RewardFunction(abc.ABC):
    """Batch contract: ``fn(records, completions) -> list[RewardResult]``, same length, same order.

    Holds pools (processes, threads, HTTP); use as a context manager or call ``close()``.

    ``streams``: score_batch scores each item on its own (item i's verdict depends only on reference i and
    completion i, never on the rest of the batch), so an RL step may score completions one by one as the
    sampler finishes them (vt.rewards.streaming) and get exactly the batch's verdicts. Off by default: a
    reward that batches across items (rubric: one judge call for the batch) is scored after decoding.
    ``workers``: how many items it verifies at once (its map_bounded bound): its options' ``workers``
    (``config``, vt.rewards.registry), else 1.
    """

    domain: str = ""
    streams: bool = False

    @property
    def workers(self) -> int:
        return getattr(getattr(self, "config", None), "workers", 1)

    def __call__(self, records: Sequence[Mapping[str, Any]], completions: Sequence[str]) -> list[RewardResult]:
        if len(records) != len(completions):
            raise ValueError(f"{len(records)} records but {len(completions)} completions")
        for i, c in enumerate(completions):
            check_completion(c, i)
        return self.score_batch(self.references(records), list(completions))

    def references(self, records: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Every record's reference, in order: RewardSpecError at the first bad one, before any work."""
        return [self.reference(r, i) for i, r in enumerate(records)]

    def score_item(self, reference: Any, completion: str) -> RewardResult:
        """One item's verdict: score_batch on that item alone, which for a reward that ``streams`` is the verdict
        the item gets in any batch (checker exceptions handled as score_batch handles them)."""
        return self.score_batch([reference], [completion])[0]

    @abc.abstractmethod
    def reference(self, record: Mapping[str, Any], index: int) -> Any:
        """Extract and validate this domain's reference from a record; raise RewardSpecError if bad."""

    def score_batch(self, references: list[Any], completions: list[str]) -> list[RewardResult]:
        """``score_one(reference, completion)`` over the items on ``workers`` threads; a reward that batches
        across items overrides this instead."""
        return map_bounded(lambda rc: self.score_one(*rc), list(zip(references, completions)), self.workers)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
