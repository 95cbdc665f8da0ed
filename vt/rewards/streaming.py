"""Verification beside decoding: completions are scored one by one as the sampler finishes them.

    with StreamingScorer(reward, records) as scorer:          # references checked here, before any decoding
        engine.generate(requests, on_finished=lambda i, j, s: scorer.submit(index(i, j), text(s)))
        results = scorer.results()                            # waits for the last verdict

Each submitted completion is scored at once on one of at most ``reward.workers`` threads (the bound its own
score_batch uses), while the caller goes on decoding the rest: the threads only wait (on verifier processes,
sandboxes, HTTP), so they cost the decode loop little. Scorers of one reward open at once (an asynchronous learner
verifies the batch it takes next while the batch ahead decodes and streams in) share that bound, the oldest
scorer's items first: the batch the learner waits for is not slowed by one it will not use before it. Only
rewards that ``stream`` (item-wise verdicts) are scored this way, so the verdicts are exactly score_batch's on the
whole batch, in the same order; the sampler's randomness is keyed by (seed, request, sample), not by timing, so
nothing else changes either.

Errors surface as score_batch raises them: references (RewardSpecError) in batch order before any work, an
exception out of a verdict from ``results()``, the first one in index order (a checker exception that the
reward turns into a verifier error stays a verifier error).

Time: every verdict's wall interval is kept (``spans``); ``busy_seconds`` turns intervals into the time during
which at least one verification ran, in all or before a moment (decoding's end: the overlap).
"""
from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from vt.rewards.base import RewardFunction, RewardResult, check_completion


class _OldestFirst:
    """One reward's `workers` verification slots, over every StreamingScorer of it open at once: a slot goes to an
    item of the oldest open scorer that has items waiting. Measured before it (bench/rl_step.py --async, k=1, 2
    verifier workers): the batch ahead's streamed items took the slots of the batch the learner waited for, whose
    verification then took 1.0-2.1 s against 0.36-0.53 s at k=0: code k=1 ran at 0.71x and 0.90x of k=0."""

    def __init__(self, workers: int):
        self.free, self.waiting = workers, {}  # waiting: open scorer (in opening order) -> its items not yet started
        self.cond = threading.Condition()

    def open(self, scorer) -> None:
        with self.cond:
            self.waiting[scorer] = 0

    def submitted(self, scorer, count: int = 1) -> None:
        with self.cond:
            self.waiting[scorer] += count

    def acquire(self, scorer) -> None:
        # An older scorer with items waiting has a thread free to start one (it holds fewer slots than its threads,
        # or no slot is free), so waiting for it cannot deadlock.
        with self.cond:
            self.cond.wait_for(lambda: self.free > 0 and self._first_waiting() is scorer)
            self.free -= 1
            self.waiting[scorer] -= 1

    def _first_waiting(self):
        return next((s for s, n in self.waiting.items() if n), None)

    def release(self) -> None:
        with self.cond:
            self.free += 1
            self.cond.notify_all()

    def close(self, scorer) -> None:
        with self.cond:
            del self.waiting[scorer]
            self.cond.notify_all()


_SLOTS: "weakref.WeakKeyDictionary[RewardFunction, _OldestFirst]" = weakref.WeakKeyDictionary()
_SLOTS_LOCK = threading.Lock()


class StreamingScorer:
    """Verdicts of one reward function for a batch of ``len(records)`` items whose completions arrive in any order.

    Use as a context manager: leaving it cancels verdicts not yet started and waits for the running ones (an
    exception while decoding must not leave threads behind)."""

    def __init__(self, reward: RewardFunction, records: Sequence[Mapping[str, Any]]):
        if not reward.streams:
            raise ValueError(f"{type(reward).__name__} does not stream: its verdicts depend on the whole batch")
        self.reward = reward
        self.references = reward.references(records)  # dataset errors before any decoding
        self.spans: list[tuple[float, float]] = []  # (start, end) of each verdict, perf_counter seconds
        self._futures: list[cf.Future | None] = [None] * len(records)
        self._lock = threading.Lock()
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, reward.workers), thread_name_prefix="vt-verify")
        with _SLOTS_LOCK:
            self._slots = _SLOTS.setdefault(reward, _OldestFirst(max(1, reward.workers)))
        self._slots.open(self)

    def submit(self, index: int, completion: str) -> None:
        """Start scoring item ``index`` (returns at once)."""
        check_completion(completion, index)
        if self._futures[index] is not None:
            raise ValueError(f"item {index} submitted twice")
        self._slots.submitted(self)  # before its thread can ask for a slot
        try:
            self._futures[index] = self._pool.submit(self._score, index, completion)
        except BaseException:
            self._slots.submitted(self, -1)
            raise

    def _score(self, index: int, completion: str) -> RewardResult:
        self._slots.acquire(self)
        start = time.perf_counter()
        try:
            return self.reward.score_item(self.references[index], completion)
        finally:
            end = time.perf_counter()
            self._slots.release()
            with self._lock:
                self.spans.append((start, end))

    def results(self) -> list[RewardResult]:
        """Every item's verdict in index order, once the last one is in."""
        missing = [i for i, f in enumerate(self._futures) if f is None]
        if missing:
            raise ValueError(f"{len(missing)} of {len(self._futures)} items were never submitted (first: {missing[0]})")
        return [f.result() for f in self._futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._slots.close(self)  # its cancelled items no longer hold back younger scorers

    def __enter__(self) -> "StreamingScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def busy_seconds(spans: Sequence[tuple[float, float]], until: float = math.inf) -> float:
    """Wall time covered by at least one of the (start, end) intervals, counting only the part before ``until``."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, until)
        if end > start:
            total += end - start
        reach = max(reach, end)
    return total
