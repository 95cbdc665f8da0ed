"""The rollout buffer of RL (vt.rl.schedule; rollout.max_staleness = k): versioned groups, released whole.

    buf = RolloutBuffer(k)
    buf.put(scored, version=v)                  # groups sampled by the policy after v updates (RL steps)
    buf.put_pending(wait, version=v, groups=E)  # a batch still being verified: wait() returns its Scored
    scored, versions = buf.take(E, version=now) # the oldest E groups at most k versions old, or None

A group (the C samples of one prompt with their verdicts) is the unit: MGPO's weight w(q) needs a group's
accuracy, so a group is never split. Groups sampled more than k versions before `now` are dropped when a take
meets them, and counted (`dropped_groups`). Every sample keeps its behaviour log-probs (Sample.logprobs, the
learner's sampler_logp) and, through its group, the version that generated it.

The buffer is a checkpoint item of its own (vt.checkpoint.manager's `rollouts`, get_state / set_state): its
groups, their versions and the drop count are saved in each checkpoint (one JSON file per process), so a resumed
run updates on exactly the samples an uninterrupted run would have; a checkpoint written with another k is
refused. At k = 0 it is empty at every checkpoint (each batch is taken in the step that samples it).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from vt import VtError
from vt.rl.rollouts import TIMES, Scored
from vt.sampling.engine import Sample

_ARRAYS = {"correct": bool, "rewards": np.float32, "valid": bool, "lengths": np.int64, "truncated": bool}


def _group_state(s: Scored, version: int) -> dict:
    """One group (s holds exactly one) as JSON: floats are float32 values, which Python floats hold exactly."""
    return {"version": int(version), "prompt": [int(t) for t in s.prompts[0]], "domain": s.domains[0],
            "samples": [{"ids": [int(t) for t in x.completion_ids], "logprobs": [float(p) for p in x.logprobs],
                         "finish": x.finish_reason, "text": x.text,
                         **({"policy": x.policy_mask.tolist()} if x.policy_mask is not None else {}),
                         **({"tool_calls": x.tool_calls, "tool_errors": x.tool_errors} if x.tool_calls else {})}
                        for x in s.samples[0]],
            **{k: np.asarray(getattr(s, k))[0].tolist() for k in _ARRAYS},
            **({"timeouts": np.asarray(s.timeouts)[0].tolist()} if s.timeouts is not None else {}),
            **({"teacher": [np.asarray(t, np.float32).tolist() for t in s.teacher[0]]} if s.teacher is not None else {})}


def _group_from_state(g: dict) -> tuple[Scored, int]:
    samples = [Sample(completion_ids=list(x["ids"]), logprobs=list(x["logprobs"]), finish_reason=x["finish"],
                      text=x["text"], policy_mask=np.asarray(x["policy"], bool) if "policy" in x else None,
                      tool_calls=x.get("tool_calls", 0), tool_errors=x.get("tool_errors", 0))
               for x in g["samples"]]
    arrays = {k: np.asarray([g[k]], dtype) for k, dtype in _ARRAYS.items()}
    timeouts = np.asarray([g["timeouts"]], bool) if "timeouts" in g else None  # older checkpoints: not recorded
    teacher = [[np.asarray(t, np.float32) for t in g["teacher"]]] if "teacher" in g else None  # OPD's (vt.rl.opd)
    return (Scored([list(g["prompt"])], [samples], domains=[g["domain"]], **arrays, timeouts=timeouts, teacher=teacher),
            int(g["version"]))


class RolloutBuffer:
    """FIFO of (group, version). Not thread-safe: the learner's loop is its only user."""

    def __init__(self, max_staleness: int):
        self.k = max_staleness
        self.groups: list[tuple[Scored, int]] = []
        # Batches still being sampled or verified: (wait for and return its Scored, version, its groups).
        self.pending: list[tuple[Callable[[], Scored], int, int]] = []
        self.dropped_groups = 0

    def __len__(self) -> int:
        """Groups held, those of pending batches included."""
        return len(self.groups) + sum(n for _, _, n in self.pending)

    def put_pending(self, result: Callable[[], Scored], version: int, groups: int) -> None:
        """A batch of `groups` groups still being sampled or verified (in the background): `result()` waits for
        it. It joins the buffer, after the batches put before it, when a take needs its groups or the state is
        saved (so a checkpoint holds it verified, as if it had been put)."""
        self.pending.append((result, int(version), int(groups)))

    def _settle(self) -> None:
        result, version, _ = self.pending.pop(0)
        self.put(result(), version)

    def put(self, scored: Scored, version: int) -> None:
        """Every group of `scored`, tagged with `version`; the step timings stay with the caller (zeroed here,
        so that a released batch's timings are not those of the rollouts its groups came from)."""
        for q in range(len(scored.prompts)):
            g = scored.select([q])
            for t in TIMES:
                setattr(g, t, 0.0)
            self.groups.append((g, int(version)))

    def drop_stale(self, version: int) -> int:
        """Drop (and count) the groups sampled more than k versions before `version`; returns how many."""
        keep = [(g, v) for g, v in self.groups if version - v <= self.k]
        dropped = len(self.groups) - len(keep)
        self.groups, self.dropped_groups = keep, self.dropped_groups + dropped
        return dropped

    def take(self, n: int, version: int) -> tuple[Scored, np.ndarray] | None:
        """The oldest `n` whole groups fit for an update at `version` (stale ones dropped first) and their
        versions [n], removed from the buffer; None (nothing removed but the stale) when fewer than n are left.
        Pending batches are waited for, oldest first, only as far as needed."""
        self.drop_stale(version)
        while len(self.groups) < n and self.pending:
            self._settle()
            self.drop_stale(version)
        if len(self.groups) < n:
            return None
        out, self.groups = self.groups[:n], self.groups[n:]
        return Scored.concat([g for g, _ in out]), np.array([v for _, v in out], np.int64)

    # --- the checkpoint item (vt.checkpoint.manager.StateHandler) --------------------------------------------------
    def get_state(self) -> dict:
        while self.pending:
            self._settle()
        return {"max_staleness": self.k, "dropped_groups": self.dropped_groups,
                "groups": [_group_state(g, v) for g, v in self.groups]}

    def set_state(self, state: dict) -> None:
        if state.get("max_staleness") != self.k:
            raise VtError(f"config rollout.max_staleness={self.k}: the checkpoint's rollout buffer was written with "
                          f"max_staleness={state.get('max_staleness')}; resume with that value or a new --workdir")
        self.groups = [_group_from_state(g) for g in state["groups"]]
        self.pending = []
        self.dropped_groups = int(state["dropped_groups"])


def staleness_metrics(versions: np.ndarray, version: int, k: int, group_size: int) -> dict[str, float]:
    """Samples of an update by age (version - their group's version) 0..k, and the oldest age."""
    ages = version - np.asarray(versions)
    if ages.size and (ages.min() < 0 or ages.max() > k):
        raise AssertionError(f"an update at version {version} was given samples of ages {sorted(set(ages))}, "
                             f"outside 0..{k}")
    counts = np.bincount(ages, minlength=k + 1) * group_size
    return {**{f"staleness/{a}": float(c) for a, c in enumerate(counts)}, "staleness_max": float(ages.max())}
