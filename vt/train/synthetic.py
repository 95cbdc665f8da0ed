"""A small learnable token task for smoke runs, tests and benchmarks (no tokenizer, no files).

Each document is  BOS  x_1 .. x_n  SEP  f(x_1) .. f(x_n)  EOS  with x_i uniform over `num_symbols` prompt
symbols and f a fixed random bijection onto a disjoint range of answer symbols: a word-by-word "translation".
The loss is on the answer and EOS only (the prompt is unpredictable by construction), so the attainable loss
is 0 and a model that learns nothing stays near log(num_symbols). Documents flow through vt.data's first-fit
packing and batching, so the batches have exactly the layout of the chat pipeline's.
"""
from __future__ import annotations

import dataclasses

import grain
import numpy as np

from vt import VtError
from vt.data.packing import PACKED_KEYS, pack_first_fit
from vt.data.shards import LogicalShardsIterDataset, plan_shards, shard_seed

PAD, BOS, SEP, EOS = 0, 1, 2, 3
_FIRST_SYMBOL = 4


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
    num_symbols: int = 48  # prompt alphabet size (the answer alphabet has the same size)
    min_len: int = 3  # words per prompt, inclusive range
    max_len: int = 12
    task_seed: int = 1234  # fixes the bijection f: the same task for every split and data seed

    @property
    def vocab_needed(self) -> int:
        return _FIRST_SYMBOL + 2 * self.num_symbols

    def example(self, index: int, seed: int, split: str) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, 0 if split == "train" else 1, index])
        perm = np.random.default_rng(self.task_seed).permutation(self.num_symbols)
        n = int(rng.integers(self.min_len, self.max_len + 1))
        x = rng.integers(0, self.num_symbols, n)
        doc = np.concatenate([[BOS], _FIRST_SYMBOL + x, [SEP], _FIRST_SYMBOL + self.num_symbols + perm[x], [EOS]])
        doc = doc.astype(np.int32)
        loss_mask = np.zeros(len(doc) - 1, np.float32)
        loss_mask[n + 1:] = 1.0  # targets from the first answer symbol through EOS
        return {"input_ids": doc[:-1], "targets": doc[1:], "loss_mask": loss_mask}


def _empty_rows(rows: int, seq_len: int) -> dict[str, np.ndarray]:
    return {k: np.zeros((rows, seq_len), np.float32 if k == "loss_mask" else np.int32) for k in PACKED_KEYS}


def synthetic_dataset(task: SyntheticTask, *, seq_len: int, global_batch_size: int, grad_accum_steps: int = 1,
                      seed: int = 0, split: str = "train", vocab_size: int | None = None,
                      process_index: int = 0, process_count: int = 1, num_examples: int = 1 << 40,
                      num_shards: int | None = None) -> grain.IterDataset:
    """Packed batches [grad_accum_steps, rows / grad_accum_steps, seq_len] of this process's share; the
    iterator (``iter(...)``) is a grain DatasetIterator with exact get_state/set_state.

    Logical shards as in :mod:`vt.data.shards`: shard s of ``num_shards`` packs examples ``s, s+S, ...`` into
    ``global_batch_size / num_shards`` rows per step; this process yields the rows of its own shards, so with a
    fixed ``num_shards`` the global batches do not depend on the process count (None: one shard per process).
    Example i is the same wherever it is read (it depends on seed, split and i only)."""
    if vocab_size is not None and task.vocab_needed > vocab_size:
        raise VtError(f"synthetic task needs {task.vocab_needed} token ids; the model's vocab_size is {vocab_size}")
    if 2 * task.max_len + 3 > seq_len:
        raise VtError(f"synthetic task: documents of up to {2 * task.max_len + 3} tokens do not fit seq_len={seq_len}")
    plan = plan_shards(global_rows=global_batch_size, micro_batches=grad_accum_steps, num_shards=num_shards,
                       process_index=process_index, process_count=process_count)
    r = plan.rows_per_shard
    shards = {}
    for s in plan.owned:
        ds = grain.MapDataset.range(num_examples)[s::plan.num_shards]
        ds = ds.map(lambda i: task.example(int(i), seed, split)).to_iter_dataset()
        ds = pack_first_fit(ds, seq_len=seq_len, num_packing_bins=r, pad_id=PAD, seed=shard_seed(seed, s),
                            shuffle_bins=False)
        shards[s] = ds.batch(r, drop_remainder=True)
    return LogicalShardsIterDataset(shards, num_shards=plan.num_shards, micro_batches=grad_accum_steps,
                                    empty_rows=lambda: _empty_rows(r, seq_len))
