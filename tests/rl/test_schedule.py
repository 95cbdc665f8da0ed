"""vt.rl.schedule.RolloutSchedule, the one rollout pipeline: which step's batch is sampled when, by which version,
and what overlaps what (event order, never a time)."""
import threading

import numpy as np
import pytest

from vt.rl.rollouts import Scored
from vt.rl.schedule import RolloutSchedule
from vt.sampling.engine import Sample

GROUPS = 2


def batch(step: int) -> Scored:
    """GROUPS one-sample groups whose rewards name the step that sampled them."""
    samples = [[Sample([step], [-0.5], "stop", str(step))] for _ in range(GROUPS)]
    return Scored([[1]] * GROUPS, samples, correct=np.zeros((GROUPS, 1), bool),
                  rewards=np.full((GROUPS, 1), step, np.float32), valid=np.ones((GROUPS, 1), bool),
                  lengths=np.ones((GROUPS, 1), int), truncated=np.zeros((GROUPS, 1), bool), domains=["math"] * GROUPS)


class Sampler:
    """sample(step, decoded): records the order of events; `started[s]` is set when batch s starts sampling."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.started = {s: threading.Event() for s in range(20)}

    def __call__(self, step, decoded):
        self.events.append(("sample", step))
        self.started[step].set()
        if decoded is not None:
            decoded()
        return batch(step)


@pytest.mark.parametrize("k", [1, 2])
def test_the_batch_ahead_is_sampled_while_the_update_runs(k):
    """k >= 1: the update of step s is waited for while the batch of step s + k is being sampled: wait() blocks
    until that batch has started sampling, so a pipeline that samples it only after the update ends (the learner
    and the sampler taking turns) deadlocks here and fails at the timeout. Every update gets the batch of its own
    step, sampled by the version k steps before (the first k: version 0), and the buffer holds k batches ahead."""
    sampler = Sampler()
    schedule = RolloutSchedule(k, GROUPS, sampler)
    for step in range(6):
        scored, versions = schedule.batch(step)
        assert scored.rewards[:, 0].tolist() == [step] * GROUPS
        assert versions.tolist() == [max(0, step - k)] * GROUPS

        def wait(step=step):
            assert sampler.started[step + k].wait(timeout=60), f"step {step}: batch {step + k} not started"
            sampler.events.append(("update done", step))
            return step
        assert schedule.beside_sampling(wait, step) == step
        assert len(schedule.buffer) == k * GROUPS
    order = sampler.events
    for step in range(6):  # batch s + k starts before the update of step s is done
        assert order.index(("sample", step + k)) < order.index(("update done", step))
    fresh, busy = schedule.report(0.0, float("inf"))
    assert busy > 0 and len(fresh.prompts) == (6 + k) * GROUPS  # every batch sampled so far, reported once
    assert schedule.report(0.0, float("inf"))[0] is None


def test_k0_samples_each_batch_in_its_own_step_and_keeps_nothing():
    """k = 0 is the same pipeline at depth 0: the batch of step s is sampled by version s before its update,
    nothing runs beside the update, and the buffer is empty after every step (what a checkpoint saves)."""
    sampler = Sampler()
    schedule = RolloutSchedule(0, GROUPS, sampler)
    for step in range(3):
        scored, versions = schedule.batch(step)
        assert versions.tolist() == [step] * GROUPS and scored.rewards[:, 0].tolist() == [step] * GROUPS
        assert schedule.beside_sampling(lambda: sampler.events.append(("update done", step)), step) is None
        assert len(schedule.buffer) == 0 and schedule.buffer.get_state()["groups"] == []
    assert sampler.events == [e for s in range(3) for e in (("sample", s), ("update done", s))]


def test_an_error_in_the_batch_ahead_reaches_the_learner():
    def sample(step, decoded):
        if step == 1:
            raise RuntimeError("verifier down")
        return batch(step)
    schedule = RolloutSchedule(1, GROUPS, sample)
    schedule.batch(0)
    with pytest.raises(RuntimeError, match="verifier down"):
        schedule.beside_sampling(lambda: None, 0)
