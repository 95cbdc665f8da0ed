"""Logical data shards: a batch stream that is the same whatever the number of processes.

The records are split into a fixed number S of *logical* shards (``num_shards``, a setting of the run, not of
the machine): shard s holds records ``s, s+S, s+2S, ...`` and is shuffled, packed and batched on its own, into
rows. The global batch of a step is the concatenation, in shard order, of each shard's next ``r = rows / S``
rows. Process p of P owns the contiguous block of shards ``[p*S/P, (p+1)*S/P)`` and produces exactly its block
of rows of the global batch, so ``jax.make_array_from_process_local_data`` assembles the same global batch for
any P that divides S.

With ``A`` micro-batches per step (gradient accumulation) each shard's ``r`` rows are cut into A consecutive
groups of ``r / A``; micro-batch a is the concatenation, in shard order, of every shard's group a. A process's
local batch ``[A, k*r/A, T]`` (k = S/P shards) is then exactly its slice of every micro-batch, again for any P.

The iterator state is per logical shard, ``{"num_shards": S, "shards": {"s": state, ...}}`` (only the shards
this process owns), so a run can resume on a different process count: each process saves the states of its
shards and a restore reads the states of the shards it owns now, wherever they were written
(:class:`vt.checkpoint.manager.CheckpointManager` stores one file per shard).

With finite data (eval, one-epoch passes) shards may run out at different batches: an exhausted shard
contributes empty rows (segment 0, no loss) until every shard of this process is exhausted.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import grain
import numpy as np

from vt import VtError

STATE_KEY = "shards"  # the state of a logical-shards iterator: {"num_shards": S, "shards": {str(s): state}}


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    num_shards: int  # S, logical shards in the whole run
    owned: tuple[int, ...]  # this process's shards, a contiguous block
    rows_per_shard: int  # r: rows each shard contributes to one step's global batch


def plan_shards(*, global_rows: int, micro_batches: int | None, num_shards: int | None, process_index: int,
                process_count: int, setting: str = "num_shards") -> ShardPlan:
    """Check the sharding arithmetic and return this process's shards. ``num_shards=None`` means one shard per
    process (the stream then depends on the process count; set a fixed number to make it independent)."""
    if not 0 <= process_index < process_count:
        raise VtError(f"process_index={process_index} is not in [0, process_count={process_count})")
    if global_rows <= 0 or global_rows % process_count:
        raise VtError(f"global_batch_size={global_rows} must be a positive multiple of process_count={process_count}")
    s = process_count if num_shards is None else int(num_shards)
    if s <= 0 or s % process_count:
        raise VtError(f"{setting}={s} must be a positive multiple of the process count ({process_count}): each "
                      f"process reads a whole number of logical data shards")
    if global_rows % s:
        raise VtError(f"{setting}={s} must divide global_batch_size={global_rows}: every logical shard gives the "
                      f"same number of rows to each step")
    r = global_rows // s
    accum = micro_batches
    if accum is not None and (accum <= 0 or r % accum):
        raise VtError(f"grad_accum_steps={accum} must divide the rows each logical data shard gives a step: "
                      f"global_batch_size={global_rows} / {setting}={s} = {r} (lower {setting} or "
                      f"grad_accum_steps)")
    k = s // process_count
    return ShardPlan(num_shards=s, owned=tuple(range(process_index * k, (process_index + 1) * k)), rows_per_shard=r)


def shard_seed(seed: int, shard: int) -> int:
    """Shuffle/packing seed of one logical shard: independent streams, fixed by (seed, shard) alone."""
    return int(np.random.SeedSequence([int(seed), int(shard)]).generate_state(1)[0] & 0x7FFFFFFF)


def is_sharded_state(state: Any) -> bool:
    return isinstance(state, dict) and STATE_KEY in state and "num_shards" in state


class LogicalShardsIterDataset(grain.IterDataset):
    """Combine per-shard batch streams (each yielding ``[r, T]`` arrays) into this process's step batches:
    ``[k*r, T]`` (``micro_batches=None``) or ``[A, k*r/A, T]``; see the module docstring."""

    def __init__(self, shards: dict[int, grain.IterDataset], *, num_shards: int, micro_batches: int | None,
                 empty_rows: Callable[[], dict[str, np.ndarray]]):
        super().__init__(list(shards.values()))
        self._ids = tuple(shards)
        self._num_shards = num_shards
        self._micro = micro_batches
        self._empty = empty_rows

    def __iter__(self) -> "LogicalShardsIterator":
        return LogicalShardsIterator([p.__iter__() for p in self._parents], self._ids, num_shards=self._num_shards,
                                     micro_batches=self._micro, empty_rows=self._empty)

    def __str__(self) -> str:
        return f"LogicalShardsIterDataset(shards={list(self._ids)} of {self._num_shards})"


class LogicalShardsIterator(grain.DatasetIterator):
    def __init__(self, parents: list[grain.DatasetIterator], ids: tuple[int, ...], *, num_shards: int,
                 micro_batches: int | None, empty_rows: Callable[[], dict[str, np.ndarray]]):
        super().__init__(parents)
        self.shard_ids = ids
        self.num_shards = num_shards
        self._micro = micro_batches
        self._empty = empty_rows
        self._done = [False] * len(ids)

    def __next__(self) -> dict[str, np.ndarray]:
        parts: list[dict[str, np.ndarray] | None] = []
        for i, it in enumerate(self._parents):
            item = None
            if not self._done[i]:
                try:
                    item = next(it)
                except StopIteration:
                    self._done[i] = True
            parts.append(item)
        if all(self._done):
            raise StopIteration
        full = [p if p is not None else self._empty() for p in parts]
        if self._micro is None:
            return {k: np.concatenate([p[k] for p in full]) for k in full[0]}
        a = self._micro
        return {k: np.concatenate([p[k].reshape(a, -1, *p[k].shape[1:]) for p in full], axis=1) for k in full[0]}

    def get_state(self) -> dict[str, Any]:
        return {"num_shards": self.num_shards,
                STATE_KEY: {str(s): it.get_state() for s, it in zip(self.shard_ids, self._parents)}}

    def set_state(self, state: dict[str, Any]) -> None:
        if not is_sharded_state(state):
            raise VtError("data iterator state: expected per-logical-shard state {'num_shards', 'shards'}; this "
                          "state was written by a pipeline without logical shards")
        if int(state["num_shards"]) != self.num_shards:
            raise VtError(f"data iterator state has num_shards={state['num_shards']}, this run uses "
                          f"num_shards={self.num_shards}: the data stream would differ (keep data.num_shards)")
        missing = [s for s in self.shard_ids if str(s) not in state[STATE_KEY]]
        if missing:
            raise VtError(f"data iterator state lacks logical shards {missing} of {self.num_shards}")
        for s, it in zip(self.shard_ids, self._parents):
            it.set_state(state[STATE_KEY][str(s)])
        self._done = [False] * len(self.shard_ids)

    def __str__(self) -> str:
        return f"LogicalShardsIterator(shards={list(self.shard_ids)} of {self.num_shards})"
