"""Which policy version samples which step's batch: the one rollout pipeline, for every staleness k.

    schedule = RolloutSchedule(k, groups, sample)    # sample(step, on_decoded) -> Scored: the learner's rollouts
    scored, versions = schedule.batch(step)          # step's batch, and its groups' versions
    result = schedule.beside_sampling(wait, step)    # wait() (the update) while the batch ahead decodes
    fresh, busy = schedule.report(t0, t_end)         # batches verified since the last report; sampler busy seconds

At step s (the learner at version s, i.e. after s steps) the batch of step s + k is sampled by version s, through
the buffer (vt.rl.buffer: versioned whole groups, the stale dropped, a checkpoint item). k = 0: sampled now and
taken at once (the on-policy learner; the buffer is empty at every checkpoint). k >= 1: sampled and verified on a
thread of its own with the sampler's copy of version s, while the learner takes the batch of step s (sampled at
version s - k; the first k steps of a fresh run at version 0), waiting for its verdicts if need be, and runs its
update; the engine takes version s + 1 once the batch ahead is decoded, whose verification goes on beside the next
step. No update uses a sample more than k versions old, and the schedule is a function of the step alone: a run
resumed from a checkpoint continues as an uninterrupted one.
"""
from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from typing import Callable

import numpy as np

from vt.checkpoint.manager import crash_test_point
from vt.rewards.streaming import busy_seconds
from vt.rl.buffer import RolloutBuffer
from vt.rl.rollouts import Scored


class RolloutSchedule:
    """The rollout pipeline of rollout.max_staleness = k over a RolloutBuffer (`buffer`, a checkpoint item)."""

    def __init__(self, k: int, groups: int, sample: Callable[[int, Callable[[], None] | None], Scored]):
        self.k, self.groups, self._sample = k, groups, sample  # groups: this process's per step
        self.buffer = RolloutBuffer(k)
        self._ahead: tuple[threading.Event, cf.Future] | None = None
        self._spans: list[list[float]] = []  # [start, end or inf] of every batch's sampling and verification
        self._unreported: list[Scored] = []  # batches verified since the last report (for their TIMES)

    def batch(self, step: int) -> tuple[Scored, np.ndarray]:
        """(Scored, versions [groups]) of step `step`'s update. A fresh run (or one resumed without the batches
        of its next steps) samples what is missing now, with the current weights: the first k steps' batches at
        version `step`. The batch of step + k is started (k >= 1: in the background; at the run's last steps too,
        so that the checkpoint holds what a longer run would use: a resume stays exact)."""
        for j in range(step + len(self.buffer) // self.groups, step + self.k):
            self._sample_now(j, step)
        if self.k:
            self._sample_ahead(step + self.k, step)
        else:
            self._sample_now(step, step)
        taken = self.buffer.take(self.groups, step)
        if taken is None:  # groups were dropped as stale: sample the step's batch now, on-policy
            self._wait_decoded()  # one decoding at a time
            self._sample_now(step, step)
            taken = self.buffer.take(self.groups, step)
        return taken

    def beside_sampling(self, wait: Callable[[], object], step: int) -> object:
        """wait() (the update dispatched for step `step`) on a thread while the batch ahead decodes; its result
        once both are done (the engine takes new weights only between batches). k = 0: wait() here."""
        if self._ahead is None:
            return wait()
        out: list = []

        def waiting():
            try:
                out.append(wait())
            except BaseException as e:  # noqa: BLE001 - raised here, in the learner's thread
                out.append(e)
        waiter = threading.Thread(target=waiting, daemon=True, name="vt-update-wait")
        waiter.start()
        self._wait_decoded()
        crash_test_point("rl-sampled-ahead", step + 1)  # crash tests: the next batch sampled, not yet saved
        waiter.join()
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    def report(self, t0: float, t_end: float) -> tuple[Scored | None, float]:
        """(the batches verified since the last report, joined (None if none): their TIMES; the seconds of
        [t0, t_end] during which some batch was being sampled or verified)."""
        done = self._unreported[:]  # the batch ahead's thread may append to it meanwhile
        del self._unreported[:len(done)]
        busy = busy_seconds([(max(a, t0), min(b, t_end)) for a, b in self._spans])
        self._spans[:] = [x for x in self._spans if x[1] > t_end]
        return (Scored.concat(done) if done else None), busy

    def _sample_now(self, step: int, version: int) -> None:
        span = [time.perf_counter(), math.inf]
        self._spans.append(span)
        scored = self._sample(step, None)
        span[1] = time.perf_counter()
        self.buffer.put(scored, version)
        self._unreported.append(scored)

    def _sample_ahead(self, step: int, version: int) -> None:
        """Batch `step` sampled and verified on a thread of its own; `_ahead`: (decoded: set once it no longer
        needs the engine, its Future), the buffer's pending batch."""
        span, decoded, future = [time.perf_counter(), math.inf], threading.Event(), cf.Future()
        self._spans.append(span)

        def job():
            try:
                scored = self._sample(step, decoded.set)
                self._unreported.append(scored)
            except BaseException as e:  # noqa: BLE001 - raised where the batch is waited for
                scored = e
            span[1] = time.perf_counter()
            (future.set_exception if isinstance(scored, BaseException) else future.set_result)(scored)
            decoded.set()
        threading.Thread(target=job, daemon=True, name="vt-sample-ahead").start()
        self._ahead = decoded, future
        self.buffer.put_pending(future.result, version, self.groups)

    def _wait_decoded(self) -> None:
        if self._ahead is not None:
            decoded, future = self._ahead
            decoded.wait()
            if future.done() and future.exception() is not None:
                raise future.exception()
