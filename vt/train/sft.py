"""The SFT learner (RECIPE stages 1-2): packed chat data, AdamW, exact resume, periodic eval and checkpoints.

    result = train(to_dataclass(SftConfig, load_config("configs/sft_stage1.py")), workdir)

Workdir layout: `checkpoints/<step>/` (vt.checkpoint.manager: each one is also a model checkpoint),
`metrics.jsonl` (one line per step: loss, lr, grad_norm, tokens_per_s, mfu, padding_fraction, batch_hash and,
every `eval_every` steps, eval_loss; batch_hash and padding_fraction are of process 0's rows of the step),
`tb/` (TensorBoard), `config.json` (the resolved config).

Steps are numbered by updates applied: the metrics line and the checkpoint of step s describe the state after
s updates. A restart finds the newest sealed checkpoint and continues from it, bitwise identically on CPU:
parameters, optimiser state, RNG and the data iterator's position are restored together.

Data: `data.num_shards` logical shards (vt.data.shards) make the global batches of every step the same on any
process count that divides it; the iterator position is checkpointed per shard, so a run saved by P processes
resumes on P' processes (same data.num_shards) with the same next batches.

The host reads each step's metrics while the device runs the next one; before any save the pending metrics
are read and checked, so a non-finite loss or gradient stops the run (the step skipped its update on device)
and nothing after the last good checkpoint is written.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import jax
import numpy as np

from vt import VtError
from vt.checkpoint.manager import CheckpointConfig, CheckpointManager
from vt.model.config import ModelConfig
from vt.sharding import MeshConfig, make_mesh
from vt.train.metrics import MetricsWriter, model_flops_per_token, peak_flops_per_device
from vt.train.losses import DEFAULT_LOSS_CHUNK
from vt.train.optim import OptimConfig, make_optimizer
from vt.train.state import ModelDef, TrainState, abstract_train_state, init_train_state, train_state_shardings
from vt.validation import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, check_fields
from vt.train.step import batch_sharding, device_batch, make_eval_step, make_train_step

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"  # vt.model preset; ignored when init_checkpoint is set (its model_config.json wins)
    init_checkpoint: str = ""  # vt model checkpoint to fine-tune ("" = random init from the preset)
    param_dtype: str = "float32"  # master weights and optimiser state
    dtype: str = "float32"  # compute dtype (bfloat16 for mixed precision)
    remat_policy: str = "none"  # none | full | dots | dots_no_batch
    attention_impl: str = "xla"  # xla | jax | cudnn | splash | auto (vt.model.config.ATTENTION_IMPLS)
    # Sequence positions per chunk of the loss / log-probs (vt.train.losses.token_logps): bounds the live float32
    # logits to rows x loss_chunk x vocab instead of rows x seq_len x vocab.
    loss_chunk: int = DEFAULT_LOSS_CHUNK
    seed: int = 0  # random init and the state's RNG

    def __post_init__(self):
        if self.loss_chunk < 1:
            raise VtError(f"config model.loss_chunk must be >= 1, got {self.loss_chunk}")


@dataclasses.dataclass(frozen=True)
class HardSubset:
    pass_rates: str = ""  # profiling JSONL (one line per prompt id); "" = train on all records
    min_trace_tokens: Annotated[int, NON_NEGATIVE] = 5000
    min_error_rate: Annotated[float, FRACTION] = 0.75
    min_rollouts: Annotated[int, AT_LEAST_1] = 8
    missing: str = "error"  # prompt without a pass rate: error | exclude | include

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class DataSection:
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
    hard_subset: HardSubset = HardSubset()

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: Annotated[int, NON_NEGATIVE] = 0  # optimiser steps; 0 = num_epochs x batches per epoch (counted with one pass over the data)
    eval_every: Annotated[int, NON_NEGATIVE] = 0  # steps between held-out evaluations (0 = only at the end, if eval data is set)
    peak_flops: Annotated[float, NON_NEGATIVE] = 0.0  # per device, for MFU; 0 = known accelerators only
    progress: bool = True  # tqdm progress bar

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class SftConfig:
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    mesh: MeshConfig = MeshConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainSection = TrainSection()
    checkpoint: CheckpointConfig = CheckpointConfig()


@dataclasses.dataclass
class TrainResult:
    step: int  # updates applied when the run stopped
    status: str  # "finished" | "preempted"
    last_metrics: dict[str, Any]


# --- building blocks --------------------------------------------------------------------------------------------

def resolve_model_config(m: ModelSection) -> ModelConfig:
    over = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat_policy=m.remat_policy, attention_impl=m.attention_impl)
    if m.init_checkpoint:
        from vt.checkpoint.params import load_model_config
        return load_model_config(m.init_checkpoint, **over)
    from vt.model.config import preset
    return preset(m.preset, **over)


def initial_params(m: ModelSection, model_cfg: ModelConfig, mesh) -> dict[str, jax.Array]:
    """The starting parameters of a run, created or restored directly in their sharding on `mesh`."""
    from vt.checkpoint.params import flat_params, load_model
    if m.init_checkpoint:
        model = load_model(m.init_checkpoint, mesh, param_dtype=m.param_dtype, dtype=m.dtype,
                           remat_policy=m.remat_policy, attention_impl=m.attention_impl)
    else:
        from vt.model.qwen2 import create_model
        model = create_model(model_cfg, mesh, seed=m.seed)
    return flat_params(model)


def restored_state(r, optimizer_steps: int, sh: TrainState) -> TrainState:
    """A TrainState from a checkpoint restore; the step counter is not stored as an array, only in meta."""
    return TrainState(step=jax.device_put(np.int32(optimizer_steps), sh.step), params=r.params,
                      opt_state=r.opt_state, rng=jax.device_put(r.rng, sh.rng))


def build_data(d: DataSection, model_cfg: ModelConfig, split: str):
    """A grain IterDataset of this process's batches (`split`: "train" repeats forever, "eval" is one pass)."""
    pi, pc = jax.process_index(), jax.process_count()
    if d.kind == "synthetic":
        from vt.train.synthetic import SyntheticTask, synthetic_dataset
        return synthetic_dataset(SyntheticTask(), seq_len=d.seq_len, global_batch_size=d.global_batch_size,
                                 grad_accum_steps=d.grad_accum_steps, seed=d.seed, split=split,
                                 vocab_size=model_cfg.vocab_size, process_index=pi, process_count=pc,
                                 num_shards=d.num_shards)
    if d.kind != "chat":
        raise VtError(f"config data.kind={d.kind!r}: expected 'chat' or 'synthetic'")
    from vt.data.dataset import PipelineConfig, build_sft_dataset
    from vt.data.sources import open_source
    from vt.data.tokenizer import load_tokenizer
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


def _hard_subset(source, tokenizer, h: HardSubset):
    from vt.data.curriculum import load_pass_rates, select_hard_subset, token_trace_length
    from vt.data.sources import SubsetSource
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
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        n = int(np.max(multihost_utils.process_allgather(np.int32(n))))
    if n == 0:
        raise VtError(f"data.train={cfg.data.train!r} does not fill a single batch of {cfg.data.global_batch_size} rows")
    return max(1, math.ceil(cfg.data.num_epochs * n))


def batch_hash(batch: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in ("input_ids", "targets", "loss_mask", "segment_ids", "positions"):
        h.update(np.ascontiguousarray(batch[k]).tobytes())
    return h.hexdigest()[:16]


class _Preemption:
    """SIGTERM sets a flag the loop polls after each step (a handler must not touch JAX)."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        def handler(signum, frame):
            self.requested = True
        try:
            self._old = signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread: preemption is then the caller's business
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


# --- the loop ---------------------------------------------------------------------------------------------------

class _Learner:
    def __init__(self, cfg: SftConfig, workdir: Path):
        self.cfg, self.workdir = cfg, workdir
        self.mesh = make_mesh(cfg.mesh)
        self.model_cfg = resolve_model_config(cfg.model)
        self.total = count_steps(cfg, self.model_cfg)
        self.optimizer, self.schedule = make_optimizer(cfg.optim, self.total)
        self.md = ModelDef(self.model_cfg)
        self.sh = train_state_shardings(self.md, self.optimizer, self.mesh)
        self.abstract = abstract_train_state(self.md, self.optimizer, self.sh)
        self.b_sh = batch_sharding(self.mesh)
        self.ckpt = CheckpointManager(workdir / "checkpoints", cfg.checkpoint, self.model_cfg)
        self.train_data = build_data(cfg.data, self.model_cfg, "train")
        self.eval_data = build_data(cfg.data, self.model_cfg, "eval") if cfg.data.eval else None
        d = cfg.data
        rows = d.global_batch_size // d.grad_accum_steps
        self.step_fn = make_train_step(self.md, self.optimizer, self.schedule, self.sh, self.abstract, self.mesh,
                                       d.grad_accum_steps, rows, d.seq_len, loss_chunk=cfg.model.loss_chunk)
        self.eval_fn = (make_eval_step(self.md, self.sh.params, self.mesh, loss_chunk=cfg.model.loss_chunk)
                        if self.eval_data is not None else None)
        peak = peak_flops_per_device(cfg.train.peak_flops)
        self.peak_total = peak * jax.device_count() if peak else None
        self.flops_per_step = model_flops_per_token(self.model_cfg, d.seq_len) * d.global_batch_size * d.seq_len

    def initial_state(self, iterator) -> TrainState:
        latest = self.ckpt.latest_step()
        if latest is not None:
            r = self.ckpt.restore(latest, self.abstract, iterator)
            log.info("resumed from %s", self.ckpt.step_dir(latest))
            return restored_state(r, latest, self.sh)
        return init_train_state(initial_params(self.cfg.model, self.model_cfg, self.mesh), self.optimizer, self.sh,
                                self.cfg.model.seed)

    def _eval_batches(self):
        """The held-out batches; with several processes, until every process's shards are exhausted (one that
        ran out earlier feeds empty rows: the compiled eval step is collective, all must call it)."""
        it = iter(self.eval_data)
        for _ in range(self.cfg.data.eval_batches):
            batch = next(it, None)
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils
                if not np.any(multihost_utils.process_allgather(np.int32(batch is not None))):
                    return
                if batch is None:
                    d = self.cfg.data
                    shape = (d.grad_accum_steps, d.global_batch_size // d.grad_accum_steps // jax.process_count(),
                             d.seq_len)
                    batch = {k: np.zeros(shape, np.float32 if k == "loss_mask" else np.int32)
                             for k in ("input_ids", "targets", "loss_mask", "segment_ids", "positions")}
            elif batch is None:
                return
            yield batch

    def evaluate(self, params) -> float:
        total = count = 0.0
        for batch in self._eval_batches():
            t, c = jax.device_get(self.eval_fn(params, device_batch(batch, self.b_sh)))
            total, count = total + float(t), count + float(c)
        if count == 0:
            raise VtError(f"data.eval={self.cfg.data.eval!r}: the held-out split has no loss tokens")
        return total / count

    def run(self) -> TrainResult:
        it = iter(self.train_data)
        state = self.initial_state(it)
        start = int(jax.device_get(state.step))
        writer = MetricsWriter(self.workdir, total_steps=self.total, start_step=start,
                               progress=self.cfg.train.progress)
        pending: dict | None = None  # the previous step's metrics, still on device
        last: dict[str, Any] = {}
        t_prev = time.perf_counter()
        status, step = "finished", start

        def flush():
            nonlocal pending, last, t_prev
            if pending is None:
                return
            m = {k: v.item() for k, v in jax.device_get(pending.pop("device")).items()}
            now = time.perf_counter()
            dt, t_prev = now - t_prev, now
            if not m.pop("finite"):
                self.ckpt.wait()  # saves in flight hold earlier, good states: let them land
                raise VtError(f"non-finite loss or gradient at step {pending['step']} (loss={m['loss']}, "
                              f"grad_norm={m['grad_norm']}): run halted, the update was not applied and no "
                              f"checkpoint after step {self.ckpt.latest_step()} was written")
            m.pop("step")
            m.update(pending)
            m["tokens_per_s"] = m["tokens"] / dt
            if self.peak_total:
                m["mfu"] = self.flops_per_step / dt / self.peak_total
            writer.write(m.pop("step"), m)
            last, pending = m, None

        try:
            with _Preemption() as preempt:
                for step in range(start, self.total):
                    try:
                        batch = next(it)
                    except StopIteration:
                        raise VtError(f"training data ran out at step {step} of {self.total}") from None
                    host = {"step": step + 1, "batch_hash": batch_hash(batch),
                            "padding_fraction": float((np.asarray(batch["segment_ids"]) == 0).mean())}
                    state, metrics = self.step_fn(state, device_batch(batch, self.b_sh))
                    flush()  # the previous step's metrics: ready by now, the device is busy with this step
                    pending = {"device": metrics, **host}
                    done = step + 1
                    final = done == self.total or preempt.requested
                    if self.eval_fn is not None and (final or (self.cfg.train.eval_every
                                                               and done % self.cfg.train.eval_every == 0)):
                        pending["eval_loss"] = self.evaluate(state.params)
                    if final or done % self.cfg.checkpoint.every == 0:
                        flush()  # check this step before its state can reach disk
                        self.ckpt.save(done, state, it, metrics=last)
                    step = done
                    if preempt.requested:
                        status = "preempted"
                        break
                flush()
        finally:
            self.ckpt.close()
            writer.close()
        return TrainResult(step=step, status=status, last_metrics=last)


def train(cfg: SftConfig, workdir: Path | str) -> TrainResult:
    """Run (or resume) SFT in `workdir` until `train.steps` updates, a SIGTERM, or a non-finite step."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    return _Learner(cfg, workdir).run()
