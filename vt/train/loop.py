"""What both learners (SFT: vt.train.sft, RL: vt.rl.learner) share: the set-up, resume, preemption, and the run
loop with its save/eval cadence and non-finite halt. Shared by composition: each learner builds a `Setup` and
hands `run_loop` its own step function (batches from data, or batches from rollouts).

    setup = Setup(cfg, workdir, model_cfg, total_updates)      # mesh, model, optimiser, shardings, checkpoints
    state, start = setup.initial_state(data_iterator, updates_per_step)
    result = run_loop(setup, state, start, total_steps, step_fn, ...)

Steps: a learner's step (a metrics line, a checkpoint directory) applies `updates_per_step` optimiser updates (SFT
1, RL mgpo.mini_batches); `TrainState.step` counts optimiser updates. `Setup.initial_state` is the one place
that converts between the two.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from vt import Preempted, Terminated, VtError
from vt.checkpoint.manager import CheckpointConfig, CheckpointManager
from vt.checkpoint.workdir import CHECKPOINTS_DIR
from vt.checkpoint.params import flat_params, load_model, load_model_config
from vt.distributed import enable_compilation_cache, is_primary, peak_flops_per_device
from vt.io import OutOfSpace, atomic_write_text, call_all, error_detail, exclusive, out_of_space, writing
from vt.model.config import ModelConfig, preset
from vt.model import lora
from vt.model.qwen2 import Qwen2, create_model, init_key
from vt.sharding import MeshConfig, make_mesh
from vt.train.losses import DEFAULT_LOSS_CHUNK
from vt.train.optim import OptimConfig, make_optimizer
from vt.tracking import LoggingConfig
from vt.tracking.run import RunTracker
from vt.train.state import ModelDef, TrainState, abstract_train_state, init_train_state, train_state_shardings
from vt.validation import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, check_fields

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelInitConfig:
    preset: str = "tiny"  # vt.model preset; ignored when init_checkpoint is set (its model_config.json wins)
    init_checkpoint: str = ""  # vt model checkpoint to fine-tune ("" = random init from the preset)
    param_dtype: str = "float32"  # master weights and optimiser state
    dtype: str = "float32"  # compute dtype (bfloat16 for mixed precision)
    remat_policy: str = "auto"  # vt.model.config.REMAT_POLICIES: auto | none | full | save_attention | dots | ...
    attention_impl: str = "xla"  # xla | jax | splash | auto (vt.model.config.IMPLS)
    # Sequence positions per chunk of the loss / log-probs (vt.train.losses.token_logps): bounds the live float32
    # logits to rows x loss_chunk x vocab instead of rows x seq_len x vocab.
    loss_chunk: Annotated[int, AT_LEAST_1] = DEFAULT_LOSS_CHUNK
    seed: Annotated[int, NON_NEGATIVE] = 0  # random init
    # LoRA (vt.model.lora): train rank-`lora_rank` adapters on the projections matching `lora_targets` (a regex
    # over q, k, v, o, gate, up, down), the base weights frozen; 0 = full fine-tuning. param_dtype=bfloat16
    # keeps the frozen base in bf16 (adapters and their optimiser state are float32).
    lora_rank: Annotated[int, NON_NEGATIVE] = 0
    lora_alpha: Annotated[float, POSITIVE] = 16.0  # the adapters' term is scaled by lora_alpha / lora_rank
    lora_dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0  # on the adapters' input, SFT only
    lora_targets: str = "q|k|v|o|gate|up|down"

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass
class TrainResult:
    step: int  # learner steps done when the run stopped
    status: str  # "finished" | "preempted"
    last_metrics: dict[str, Any]
    eval_history: list[tuple[int, float]]  # (step, held-out metric: SFT eval_loss, RL eval_accuracy)
    history: list[dict[str, Any]]  # the lines of metrics.jsonl, a resumed run's earlier ones included


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The fields of a learner's `train` section that `Setup` and `run_loop` read: each learner's train section
    (vt.train.sft.SftTrainConfig, vt.rl.learner.RLTrainConfig) is one, with its own fields added."""
    # Steps between held-out evaluations, which also run at the last step (RL: and at the start) when eval data is
    # set, never at a SIGTERM; 0 = none in between.
    eval_every: Annotated[int, NON_NEGATIVE] = 0
    peak_flops: Annotated[float, NON_NEGATIVE] = 0.0  # per device, for MFU; 0 = known accelerators only
    progress: bool = True  # tqdm progress bar
    compilation_cache: str = ""  # JAX persistent compilation cache directory ("" = off; vt.distributed)

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The sections `Setup` and `run_loop` read; each learner's config (vt.train.sft.SftConfig,
    vt.rl.learner.RLConfig) is one, with its own sections added and its own `train` (a LoopConfig)."""
    learner: str = ""  # which learner reads this config (`vt train` dispatches on it)
    model: ModelInitConfig = ModelInitConfig()
    mesh: MeshConfig = MeshConfig()
    optim: OptimConfig = OptimConfig()
    train: LoopConfig = LoopConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()


def check_learner(cfg: LearnerConfig, expected: str) -> None:
    """The config's top-level `learner` field names the learner that reads it (`vt train` dispatches on it)."""
    if cfg.learner != expected:
        raise VtError(f"config learner={cfg.learner!r}: this config is read by the {expected!r} learner "
                      f"(set learner = {expected!r})")


def resolve_model_config(m: ModelInitConfig) -> ModelConfig:
    over = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat_policy=m.remat_policy, attention_impl=m.attention_impl,
                lora_rank=m.lora_rank, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                lora_targets=m.lora_targets)
    if m.init_checkpoint:
        return load_model_config(m.init_checkpoint, **over)
    return preset(m.preset, **over)


def initial_params(m: ModelInitConfig, model_cfg: ModelConfig, mesh) -> dict[str, jax.Array]:
    """The starting parameters of a run, created or restored directly in their sharding on `mesh`. A LoRA run
    (model_cfg.lora_rank) starts from the checkpoint's weights (a LoRA checkpoint's adapters merged into them)
    with fresh adapters (vt.model.lora.add_adapters: B = 0, so the run starts at the checkpoint's function)."""
    if not m.init_checkpoint:
        return flat_params(create_model(model_cfg, mesh, seed=m.seed))
    model = load_model(m.init_checkpoint, mesh, param_dtype=m.param_dtype, dtype=m.dtype,
                       remat_policy=m.remat_policy, attention_impl=m.attention_impl)
    params = flat_params(model)
    if not model_cfg.lora_rank and not model.cfg.lora_rank:
        return params
    base = jax.jit(lambda p: lora.merged_params(p, model.cfg))(params)
    if not model_cfg.lora_rank:
        return base
    return base | fresh_adapters(model_cfg, mesh, m.seed)


def fresh_adapters(model_cfg: ModelConfig, mesh, seed: int) -> dict[str, jax.Array]:
    """The initial LoRA adapters of `model_cfg`, in their sharding. The jitted init draws the whole model; XLA
    drops the base weights' random ops, which nothing returns, so no base-sized buffer is made."""
    out = lora.trainable(ModelDef(model_cfg).param_shardings(mesh)) if mesh is not None else None
    draw = lambda key_data: lora.trainable(flat_params(Qwen2(model_cfg, rngs=nnx.Rngs(  # noqa: E731
        jax.random.wrap_key_data(key_data)))))
    return jax.jit(draw, out_shardings=out)(init_key(seed))  # the seed an input (vt.model.qwen2.init_fn)


def write_run_config(cfg: LearnerConfig, workdir: Path) -> None:
    """workdir/config.json: the resolved config of the run (process 0)."""
    if jax.process_index() == 0:
        path = workdir / "config.json"
        with writing(path):
            atomic_write_text(path, json.dumps(dataclasses.asdict(cfg), indent=2, default=str))


@contextlib.contextmanager
def run_workdir(cfg: LearnerConfig, workdir: Path | str) -> Iterator[Path]:
    """A learner's workdir for the whole run: created, locked (vt.io.exclusive: a second learner on the same
    workdir is refused with the pid of this one before it writes anything, where two would interleave
    metrics.jsonl and delete each other's checkpoints), holding the run's config.json (written by run_loop once the
    learner is set up: a run refused before that leaves a workdir it found empty or absent so). Process 0 holds the lock
    for every process of a multi-process run. Taken before JAX starts its backend (is_primary asks none of a
    single process), so a refused second run never claims device memory the first one is using."""
    workdir = Path(workdir).absolute()
    created = not workdir.exists()
    was_empty = created or (workdir.is_dir() and not any(workdir.iterdir()))
    try:
        with exclusive(workdir, "workdir", inside=True, enabled=is_primary()):
            yield workdir
    except BaseException:
        if was_empty and is_primary():
            _remove_if_empty(workdir / CHECKPOINTS_DIR, *([workdir] if created else []))
        raise


def _remove_if_empty(*dirs: Path) -> None:
    """rmdir each of `dirs` that is empty, never a file: a run refused at set-up (an invalid override, a batch no
    shard count divides) leaves a workdir it created as it found it, absent. Called once the lock is released
    (its file is inside the workdir); a run that started meanwhile holds its own lock file there, so the rmdir
    fails and its workdir stays."""
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()


class Preemption:
    """SIGTERM sets a flag the loop polls after each step (a handler must not touch JAX): the loop saves and
    stops. A SIGTERM once the run is stopping (`stop()`: waiting for saves in flight, after the end, a
    preemption or an error), or a second one, raises Terminated: the process ends now, not after the wait."""

    def __init__(self):
        self.requested = False
        self.stopping: str | None = None  # why the run is stopping, once it is
        self._old = None

    def stop(self, error: BaseException | None) -> None:
        self.stopping = f"error: {error_detail(error)}" if error is not None else \
            "stopping after a preemption" if self.requested else "stopping at the end"

    def __enter__(self):
        def handler(signum, frame):
            if self.stopping is None and not self.requested:
                self.requested = True
                return
            why = self.stopping or "a second SIGTERM"
            raise Terminated(f"{why}; SIGTERM: stopped without waiting for saves in flight (checkpoints sealed "
                             f"so far are intact; re-run to resume)")
        try:
            self._old = signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread: preemption is then the caller's business
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


class Setup:
    """What every learner builds from its config (LearnerConfig): the mesh, the model, the optimiser over
    `total_updates` updates, the state's shardings and abstract state, the checkpoint manager and the peak FLOPs
    for MFU. The learners read these attributes from it (setup.mesh, setup.md, setup.optimizer, ...)."""

    def __init__(self, cfg: LearnerConfig, workdir: Path, model_cfg: ModelConfig, total_updates: int,
                 devices: Sequence[jax.Device] | None = None):
        if cfg.train.compilation_cache:
            enable_compilation_cache(cfg.train.compilation_cache)
        self.cfg, self.workdir, self.model_cfg = cfg, workdir, model_cfg
        self.mesh = make_mesh(cfg.mesh, devices)  # devices: the learner's (None: all)
        self.md = ModelDef(model_cfg)
        self.optimizer, self.schedule = make_optimizer(cfg.optim, total_updates)
        self.sh = train_state_shardings(self.md, self.optimizer, self.mesh)
        self.abstract = abstract_train_state(self.md, self.optimizer, self.sh)
        self.ckpt = CheckpointManager(workdir / CHECKPOINTS_DIR, cfg.checkpoint, model_cfg)
        peak = peak_flops_per_device(cfg.train.peak_flops)
        self.peak_total = peak * self.mesh.devices.size if peak else None  # the mesh's devices, for MFU; None: unknown

    def initial_state(self, data_iterator=None, updates_per_step: int = 1, rollouts=None) -> tuple[TrainState, int]:
        """(state, learner steps done): the newest sealed checkpoint (the data iterator's position and the RL
        rollout buffer restored in place), else fresh optimiser state around the model's initial parameters."""
        latest = self.ckpt.latest_step()
        if latest is None:
            return init_train_state(initial_params(self.cfg.model, self.model_cfg, self.mesh), self.optimizer,
                                    self.sh), 0
        r = self.ckpt.restore(latest, self.abstract, data_iterator, rollouts=rollouts)
        log.info("resumed from %s", self.ckpt.step_dir(latest))
        # The update counter is not stored as an array, only as the step in meta.
        updates = jax.device_put(np.int32(latest * updates_per_step), self.sh.step)
        return TrainState(step=updates, params=r.params, opt_state=r.opt_state), latest


def run_loop(setup: Setup, state: TrainState, start: int, total: int,
             step_fn: Callable[[TrainState, int], tuple[TrainState, dict]], *,
             evaluate: Callable[[TrainState, int], float] | None = None, eval_key: str = "",
             eval_at_start: bool = False, data_iterator=None, rollouts=None,
             host_metrics: Callable[[dict, float], dict] | None = None, close: Callable[[], None] | None = None
             ) -> TrainResult:
    """Steps start..total-1 of a learner, until the last, a SIGTERM (then status "preempted"), a non-finite
    step (a VtError, raised before any checkpoint of that state is written) or an error (`_as_reported`).

    `step_fn(state, step) -> (state, metrics)`: one learner step; its metrics are read while the device runs the
    next step (`_Lines`). Held-out `evaluate(state, step)` -> `eval_key` runs every `train.eval_every` steps (0:
    never in between) and at the last step (and at step 0 with `eval_at_start`), not at a step a SIGTERM stops
    the run after: a resumed run's metrics.jsonl equals a straight one's. A checkpoint is saved every
    `checkpoint.every` steps and at the end or on SIGTERM, once the step is checked; a background save's failure
    (a full disk) is looked for after every step. `close` runs last, however the loop ends."""
    ckpt, every, eval_every = setup.ckpt, setup.cfg.checkpoint.every, setup.cfg.train.eval_every
    lines: _Lines | None = None
    history: list[tuple[int, float]] = []
    status, step, error = "finished", start, None
    with Preemption() as preempt:
        try:
            # Written once the learner is built and its checkpoint restored: a run refused at set-up (a config the
            # learner rejects, a resume with another rollout.max_staleness) leaves the workdir's config.json alone.
            write_run_config(setup.cfg, setup.workdir)
            lines = _Lines(setup, start, total, host_metrics)
            if evaluate is not None and eval_at_start and start == 0:
                history.append((0, evaluate(state, 0)))
                lines.tracker.log(0, {eval_key: history[-1][1]})
            for step in range(start + 1, total + 1):  # step: learner steps done once step_fn returns
                state, metrics = step_fn(state, step - 1)
                pending = lines.add(step, metrics)
                if evaluate is not None and (step == total or (eval_every and step % eval_every == 0)):
                    history.append((step, evaluate(state, step)))
                    pending.extra[eval_key] = history[-1][1]
                if step == total or preempt.requested or step % every == 0:
                    lines.flush()  # check this step before its state can reach disk
                    ckpt.save(step, state, data_iterator, metrics=lines.last, rollouts=rollouts)
                ckpt.check()  # a background save that failed (a full disk) stops the run now
                if preempt.requested:
                    status = "preempted"
                    break
            lines.flush()
        except Terminated:
            raise
        except BaseException as e:  # every error still closes what the run opened; the first one is reported
            error = e
        preempt.stop(error)
        _test_hold("stopping")
        error = _close_all([ckpt.close] + ([lines.tracker.close] if lines else []) + ([close] if close else []), error)
    if error is not None:
        raise _as_reported(error, preempt.requested, ckpt)
    return TrainResult(step=step, status=status, last_metrics=lines.last, eval_history=history,
                       history=lines.tracker.rows)


@dataclasses.dataclass
class _Pending:
    """A step's metrics line, not yet written."""
    step: int
    metrics: dict[str, Any]  # maybe still on device
    extra: dict[str, float] = dataclasses.field(default_factory=dict)  # host values (the held-out metric)


class _Lines:
    """metrics.jsonl (RunTracker) of a run. A step's line is written once the next step is dispatched (the
    host never waits for the device: nanodo's "dispatch step N, then read step N-1's metrics"), or earlier when
    the run needs the step checked (`flush`: before its checkpoint, at the end). Checking it halts the run on a
    skipped update (`finite` 0: non-finite loss or gradient). `host_metrics(metrics, seconds since the last
    line)` adds what needs the wall time."""

    def __init__(self, setup: Setup, start: int, total: int, host_metrics: Callable[[dict, float], dict] | None):
        cfg = setup.cfg
        self.ckpt, self.host_metrics = setup.ckpt, host_metrics
        self.pending: _Pending | None = None
        self.last: dict[str, Any] = {}  # the newest line written
        self.t_prev = time.perf_counter()
        self.tracker = RunTracker(setup.workdir, total_steps=total, start_step=start, enabled=jax.process_index() == 0,
                                  progress=cfg.train.progress, logging_cfg=cfg.logging,
                                  config=dataclasses.asdict(cfg), job_type=cfg.learner)

    def add(self, step: int, metrics: dict[str, Any]) -> _Pending:
        self.flush()  # the previous step's: ready by now, the device is busy with this step
        self.pending = _Pending(step, metrics)
        return self.pending

    def flush(self) -> None:
        p, self.pending = self.pending, None
        if p is None:
            return
        m = {k: (v.item() if hasattr(v, "item") else v) for k, v in jax.device_get(p.metrics).items()}
        if "finite" in m and not m.pop("finite"):
            self.ckpt.wait()  # saves in flight hold earlier, good states: let them land
            raise VtError(f"non-finite loss or gradient at step {p.step} (loss={m.get('loss')}, "
                          f"grad_norm={m.get('grad_norm')}): run halted, the non-finite update was not applied "
                          f"and no checkpoint after step {self.ckpt.latest_step()} was written")
        now = time.perf_counter()
        dt, self.t_prev = now - self.t_prev, now
        m |= p.extra
        self.last = self.host_metrics(m, dt) if self.host_metrics is not None else m
        self.tracker.log(p.step, self.last)


def _close_all(closers: list[Callable[[], None]], error: BaseException | None) -> BaseException | None:
    """Run every closer (vt.io.call_all); the run's error, else the first closer's."""
    try:
        call_all(closers)
    except Exception as e:
        return error or e
    return error


def _as_reported(error: BaseException, preempted: bool, ckpt: CheckpointManager) -> BaseException:
    """The error a run stopped with, as the CLI reports it: a full disk (met by any writer) is an OutOfSpace
    naming what could not be written and the newest sealed step, the one the run resumes from; after a SIGTERM
    an error the user can act on is a Preempted (exit status EXIT_PREEMPTED). A SIGTERM while stopping raises
    Terminated (Preemption)."""
    if out_of_space(error) and not isinstance(error, VtError):  # a writer not wrapped in vt.io.writing
        error = OutOfSpace(f"out of disk space ({error_detail(error)})").with_traceback(error.__traceback__)
    if isinstance(error, OutOfSpace):
        latest = ckpt.latest_step()
        resume = "no checkpoint was sealed yet" if latest is None else \
            f"the newest sealed checkpoint is step {latest} (free space and re-run to resume from it)"
        error = OutOfSpace(f"{error}; {resume}").with_traceback(error.__traceback__)
    if preempted and isinstance(error, VtError) and not isinstance(error, Preempted):
        error = Preempted(f"SIGTERM, then {error}").with_traceback(error.__traceback__)
    return error


def _test_hold(point: str) -> None:
    """Fault injection for the signal tests: at `point`, when VT_TEST_HOLD_AT names it, create the file
    VT_TEST_HOLD_FILE and wait until the test deletes it (at most 60 s), signals handled meanwhile: a window of
    microseconds (after a full disk stopped the run, before its clean-up) made as long as the test needs."""
    hold = os.environ.get("VT_TEST_HOLD_FILE", "")
    if os.environ.get("VT_TEST_HOLD_AT") != point or not hold:
        return
    open(hold, "w").close()
    end = time.monotonic() + 60
    while os.path.exists(hold) and time.monotonic() < end:
        time.sleep(0.01)
