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
from vt.data.packing import pack_first_fit

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


class _Split(grain.transforms.Map):
    def __init__(self, accum: int):
        self._accum = accum

    def map(self, batch):
        return {k: v.reshape(self._accum, -1, v.shape[-1]) for k, v in batch.items()}


def synthetic_dataset(task: SyntheticTask, *, seq_len: int, global_batch_size: int, grad_accum_steps: int = 1,
                      seed: int = 0, split: str = "train", vocab_size: int | None = None,
                      process_index: int = 0, process_count: int = 1, num_examples: int = 1 << 40) -> grain.IterDataset:
    """Packed batches [grad_accum_steps, rows / grad_accum_steps, seq_len] of this process's share; the
    iterator (``iter(...)``) is a grain DatasetIterator with exact get_state/set_state."""
    if vocab_size is not None and task.vocab_needed > vocab_size:
        raise VtError(f"synthetic task needs {task.vocab_needed} token ids; the model's vocab_size is {vocab_size}")
    if 2 * task.max_len + 3 > seq_len:
        raise VtError(f"synthetic task: documents of up to {2 * task.max_len + 3} tokens do not fit seq_len={seq_len}")
    rows = global_batch_size // process_count
    if global_batch_size % process_count or rows % grad_accum_steps:
        raise VtError(f"global_batch_size={global_batch_size} must split over {process_count} processes and "
                      f"grad_accum_steps={grad_accum_steps}")
    ds = grain.MapDataset.range(num_examples)[process_index::process_count]
    ds = ds.map(lambda i: task.example(int(i), seed, split)).to_iter_dataset()
    ds = pack_first_fit(ds, seq_len=seq_len, num_packing_bins=rows, pad_id=PAD, seed=seed, shuffle_bins=False)
    return ds.batch(rows, drop_remainder=True).map(_Split(grad_accum_steps))
