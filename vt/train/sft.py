"""The SFT learner (RECIPE stages 1-2): packed chat data, AdamW, exact resume, periodic eval and checkpoints.

    result = train(to_dataclass(SftConfig, load_config("configs/sft_stage1.py")), workdir)

Workdir layout: `checkpoints/<step>/` (vt.checkpoint.manager: each one is also a model checkpoint),
`metrics.jsonl` (one line per step: loss, lr, grad_norm, tokens_per_s, mfu, padding_fraction, batch_hash and,
every `eval_every` steps, eval_loss; batch_hash and padding_fraction are of process 0's rows of the step),
`tb/` (TensorBoard), `config.json` (the resolved config).

Steps are numbered by updates applied: the metrics line and the checkpoint of step s describe the state after
s updates. A restart finds the newest sealed checkpoint and continues from it, bitwise identically on CPU:
parameters, optimiser state and the data iterator's position are restored together.

Data: `data.num_shards` logical shards (vt.data.shards) make the global batches of every step the same on any
process count that divides it; the iterator position is checkpointed per shard, so a run saved by P processes
resumes on P' processes (same data.num_shards) with the same next batches.

The loop (set-up, resume, preemption, cadence, the non-finite halt) is vt.train.loop's, shared with RL; SFT
adds its batches. The host reads each step's metrics while the device runs the next one; before any save the
pending metrics are read and checked, so a non-finite loss or gradient stops the run (the step skipped its
update on device) and nothing after the last good checkpoint is written.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from pathlib import Path
from typing import Annotated

import jax
import numpy as np

from vt import VtError
from vt.data.curriculum import load_pass_rates, select_hard_subset, token_trace_length
from vt.data.dataset import PipelineConfig, build_sft_dataset
from vt.data.sources import SubsetSource, open_source
from vt.data.tokenizer import load_tokenizer
from vt.distributed import allgather, global_batch
from vt.model.config import ModelConfig
from vt.train.loop import (LearnerConfig, LoopConfig, Setup, TrainResult, check_learner, resolve_model_config,
                           run_loop, run_workdir)
from vt.train.step import BATCH_DTYPES, BATCH_KEYS, as_microbatches, batch_sharding, make_eval_step, make_train_step
from vt.train.synthetic import SyntheticTask, synthetic_dataset
from vt.validation import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, check_fields

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HardSubsetConfig:
    pass_rates: str = ""  # profiling JSONL (one line per prompt id); "" = train on all records
    min_trace_tokens: Annotated[int, NON_NEGATIVE] = 5000
    min_error_rate: Annotated[float, FRACTION] = 0.75
    min_rollouts: Annotated[int, AT_LEAST_1] = 8
    missing: str = "error"  # prompt without a pass rate: error | exclude | include

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class SftDataConfig:
    kind: str = "chat"  # chat (vt.data pipeline over `train`) | synthetic (vt.train.synthetic)
    train: str = ""  # vt.data.open_source spec: files, globs, comma-separated lists, tfds:NAME
    eval: str = ""  # held-out source spec ("" = no eval); synthetic: any non-empty value enables it
    tokenizer: str = ""  # tokenizer directory or SentencePiece model
    seq_len: Annotated[int, AT_LEAST_1] = 4096
    global_batch_size: Annotated[int, AT_LEAST_1] = 128  # packed rows per optimiser step, all processes together
    grad_accum_steps: Annotated[int, AT_LEAST_1] = 1  # micro-batches per step (must divide global_batch_size / num_shards)
    # Logical data shards (vt.data.shards): each packs its own records into global_batch_size / num_shards rows
    # of every step. Fixed per run, so the batches (and a resume) are the same on any process count that
    # divides it; must be a multiple of the process count and divide global_batch_size.
    num_shards: Annotated[int, AT_LEAST_1] = 8
    num_epochs: Annotated[float, POSITIVE] = 5.0  # sets the step count when train.steps == 0
    seed: Annotated[int, NON_NEGATIVE] = 0
    overlong: str = "truncate_right"  # truncate_right | drop
    max_skip_rate: Annotated[float, FRACTION] = 0.05
    read_threads: Annotated[int, NON_NEGATIVE] = 4  # 0 = in the calling thread
    eval_batches: Annotated[int, NON_NEGATIVE] = 4  # batches of the held-out split per evaluation
    hard_subset: HardSubsetConfig = HardSubsetConfig()

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class SftTrainConfig(LoopConfig):
    # optimiser steps; 0 = num_epochs x batches per epoch (counted with one pass over the data)
    steps: Annotated[int, NON_NEGATIVE] = 0


@dataclasses.dataclass(frozen=True)
class SftConfig(LearnerConfig):
    learner: str = "sft"
    data: SftDataConfig = SftDataConfig()
    train: SftTrainConfig = SftTrainConfig()

    def __post_init__(self):
        check_learner(self, "sft")


# --- building blocks --------------------------------------------------------------------------------------------

def build_data(d: SftDataConfig, model_cfg: ModelConfig, split: str):
    """A grain IterDataset of this process's batches (`split`: "train" repeats forever, "eval" is one pass)."""
    pi, pc = jax.process_index(), jax.process_count()
    if d.kind == "synthetic":
        return synthetic_dataset(SyntheticTask(), seq_len=d.seq_len, global_batch_size=d.global_batch_size,
                                 grad_accum_steps=d.grad_accum_steps, seed=d.seed, split=split,
                                 vocab_size=model_cfg.vocab_size, process_index=pi, process_count=pc,
                                 num_shards=d.num_shards)
    if d.kind != "chat":
        raise VtError(f"config data.kind={d.kind!r}: expected 'chat' or 'synthetic'")
    spec = d.train if split == "train" else d.eval
    if not spec or not d.tokenizer:
        raise VtError("config data.train and data.tokenizer must be set for data.kind='chat'")
    tokenizer = load_tokenizer(d.tokenizer)
    source = open_source(spec)
    if split == "train" and d.hard_subset.pass_rates:
        source = _hard_subset(source, tokenizer, d.hard_subset)
    pipe = PipelineConfig(seq_len=d.seq_len, global_batch_size=d.global_batch_size,
                          grad_accum_steps=d.grad_accum_steps, num_epochs=None if split == "train" else 1,
                          seed=d.seed, shuffle=split == "train", overlong=d.overlong,
                          vocab_size=model_cfg.vocab_size, max_skip_rate=d.max_skip_rate, read_threads=d.read_threads,
                          num_shards=d.num_shards)
    return build_sft_dataset(source, tokenizer, pipe, process_index=pi, process_count=pc).iter_dataset


def _hard_subset(source, tokenizer, h: HardSubsetConfig):
    indices, report = select_hard_subset(source, load_pass_rates(h.pass_rates), trace_length=token_trace_length(tokenizer),
                                         min_trace_tokens=h.min_trace_tokens, min_error_rate=h.min_error_rate,
                                         min_rollouts=h.min_rollouts, missing=h.missing)
    log.info("stage-2 hard subset: %s", report)
    if not indices:
        raise VtError(f"data.hard_subset: no record selected from {h.pass_rates} ({report})")
    return SubsetSource(source, indices)


def count_steps(cfg: SftConfig, model_cfg: ModelConfig) -> int:
    if cfg.train.steps > 0:
        return cfg.train.steps
    if cfg.data.kind != "chat":
        raise VtError("config train.steps must be set (> 0) for synthetic data")
    # One pass over this process's logical shards, packed as in training: exact batches per epoch. An epoch
    # ends when its longest shard does (shorter ones give empty rows), so the count is the same on any
    # number of processes: the largest over them.
    one_epoch = dataclasses.replace(cfg.data, eval=cfg.data.train)
    n = sum(1 for _ in build_data(one_epoch, model_cfg, "eval"))
    n = int(np.max(allgather(np.int32(n))))
    if n == 0:
        raise VtError(f"data.train={cfg.data.train!r} does not fill a single batch of {cfg.data.global_batch_size} rows")
    return max(1, math.ceil(cfg.data.num_epochs * n))


def batch_hash(batch: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in BATCH_KEYS:
        h.update(np.ascontiguousarray(batch[k]).tobytes())
    return h.hexdigest()[:16]


class Learner:
    """SFT: batches from the data pipeline, one optimiser update per step (the loop: vt.train.loop)."""

    def __init__(self, cfg: SftConfig, workdir: Path):
        self.cfg, self.workdir = cfg, workdir
        model_cfg = resolve_model_config(cfg.model)
        self.total = count_steps(cfg, model_cfg)
        self.setup = s = Setup(cfg, workdir, model_cfg, self.total)
        self.b_sh = batch_sharding(s.mesh)
        self.train_data = build_data(cfg.data, model_cfg, "train")
        self.eval_data = build_data(cfg.data, model_cfg, "eval") if cfg.data.eval else None
        d = cfg.data
        rows = d.global_batch_size // d.grad_accum_steps
        self.step_fn = make_train_step(s.md, s.optimizer, s.schedule, s.sh, s.abstract, s.mesh,
                                       d.grad_accum_steps, rows, d.seq_len, loss_chunk=cfg.model.loss_chunk)
        self.eval_fn = (make_eval_step(s.md, s.sh.params, s.mesh, loss_chunk=cfg.model.loss_chunk)
                        if self.eval_data is not None else None)
        self.flops_per_step = model_cfg.flops_per_token(d.seq_len) * d.global_batch_size * d.seq_len

    def device_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows of a step's batch -> the global [A, b, T] arrays."""
        return global_batch(as_microbatches(batch), self.b_sh, row_axis=1)

    def _eval_batches(self):
        """The held-out batches; with several processes, until every process's shards are exhausted (one that
        ran out earlier feeds empty rows: the compiled eval step is collective, all must call it)."""
        it = iter(self.eval_data)
        for _ in range(self.cfg.data.eval_batches):
            batch = next(it, None)
            if jax.process_count() > 1:
                if not np.any(allgather(np.int32(batch is not None))):
                    return
                if batch is None:
                    d = self.cfg.data
                    shape = (d.grad_accum_steps, d.global_batch_size // d.grad_accum_steps // jax.process_count(),
                             d.seq_len)
                    batch = {k: np.zeros(shape, BATCH_DTYPES[k]) for k in BATCH_KEYS}
            elif batch is None:
                return
            yield batch

    def evaluate(self, state, step: int) -> float:
        """Held-out loss: the per-token mean NLL over `data.eval_batches` batches."""
        total = count = 0.0
        for batch in self._eval_batches():
            t, c = jax.device_get(self.eval_fn(state.params, self.device_batch(batch)))
            total, count = total + float(t), count + float(c)
        if count == 0:
            raise VtError(f"data.eval={self.cfg.data.eval!r}: the held-out split has no loss tokens")
        return total / count

    def run(self) -> TrainResult:
        it = iter(self.train_data)
        state, start = self.setup.initial_state(it)

        def step_fn(state, step):
            try:
                batch = next(it)
            except StopIteration:
                raise VtError(f"training data ran out at step {step} of {self.total}") from None
            host = {"batch_hash": batch_hash(batch),
                    "padding_fraction": float((np.asarray(batch["segment_ids"]) == 0).mean())}
            state, metrics = self.step_fn(state, self.device_batch(batch))
            return state, metrics | host

        def host_metrics(m, seconds):
            m["tokens_per_s"] = m["tokens"] / seconds
            if self.setup.peak_total:
                m["mfu"] = self.flops_per_step / seconds / self.setup.peak_total
            return m

        return run_loop(self.setup, state, start, self.total, step_fn,
                        evaluate=self.evaluate if self.eval_fn is not None else None, eval_key="eval_loss",
                        data_iterator=it, host_metrics=host_metrics)


def train(cfg: SftConfig, workdir: Path | str) -> TrainResult:
    """Run (or resume) SFT in `workdir` until `train.steps` updates, a SIGTERM, or a non-finite step."""
    with run_workdir(cfg, workdir) as workdir:
        return Learner(cfg, workdir).run()
