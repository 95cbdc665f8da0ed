"""The learners' checkpoint manager: Orbax CheckpointManager plus what a long run needs around it.

Each step directory `DIR/<step>/` holds
    params/             the flat parameter dict, exactly as in a model checkpoint (vt.checkpoint.params)
    model_config.json   so `load_model(DIR/<step>)` and `vt convert orbax-to-hf DIR/<step> ...` work on it
    opt_state/          the optimiser state (sharded like the params)
    meta/               JSON: the step (older checkpoints also hold an unused RNG key, ignored on restore)
    data/               the data iterator's state: one file per logical data shard, shard_<s>-of-<S>.json,
                        written by the process that owns the shard and read by whichever process owns it at
                        restore (so a run resumes on another process count; vt.data.shards); an iterator
                        without logical shards: one file per process, process_<i>-of-<n>.json (as grain's)
    rollouts/           the RL rollout buffer (vt.rl.buffer: groups sampled ahead, their versions), one file per
                        process, process_<i>-of-<n>.json
    vt_checksums.json   sha256 of every other file, written last: its presence seals the step

Saves are asynchronous (the train loop continues while Orbax writes). The seal is written by Orbax's
post-finalisation callback into Orbax's temporary directory once every item is written, so the step appears
(Orbax's atomic rename) already sealed. A step committed but unsealed (its seal deleted, an older vt's step, a
kill between a synchronous save's commit and its seal) is refused at start-up with one line, unless
--trust-checkpoint accepts it (recognised complete by Orbax's commit marker, then sealed). Orbax retires old
steps by renaming them into `.vt-deleted/` and we delete them from there, so a kill during a deletion never
leaves a half-deleted step to resume from. On
start-up, Orbax's temporary directories (saves that never committed) are removed and reported. A restore
verifies the seal while Orbax reads the files: any difference is a VtError naming the step and the file, never
a silently wrong value; a resume with another model is named as such.
Retention: the newest `keep` steps, plus the best step by `best_metric` (when given).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from vt import VtError
from vt.checkpoint.io import reader_error
from vt.checkpoint.params import CONFIG_FILE, load_model_config
from vt.checkpoint.seal import (CHECKSUM_FILE, BackgroundVerify, is_sealed, missing_files,  # noqa: F401
                                read_seal, sealed_steps, verify_enabled, write_seal)
from vt.checkpoint.workdir import CHECKPOINTS_DIR, is_run_dir
from vt.data.shards import STATE_KEY, is_sharded_state
from vt.io import writing
from vt.model.config import ModelConfig, architecture
from vt.validation import AT_LEAST_1, check_fields

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^\d+$")
_TMP_MARK = ".orbax-checkpoint-tmp"
_COMMIT_FILE = "commit_success.txt"  # Orbax's commit marker
_STEP_METADATA = "_CHECKPOINT_METADATA"
# Orbax renames a step it retires into this subdirectory (one atomic rename) and we delete it from there: a kill
# during the deletion then leaves a whole step or none in the step namespace, never a half-deleted one.
TRASH_DIR = ".vt-deleted"
_ITEMS = ("params", "opt_state", "meta")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: Annotated[int, AT_LEAST_1] = 1000  # save every N optimiser steps (and always at the end and on SIGTERM)
    keep: Annotated[int, AT_LEAST_1] = 3  # newest checkpoints kept; older ones are deleted (set large for checkpoint merging)
    best_metric: str = ""  # also keep the best step by this metric (e.g. "eval_loss"); "" = newest only
    best_mode: str = "min"  # "min" or "max" for best_metric
    async_save: bool = True  # write in the background while training continues
    checksum: bool = True  # seal each step with sha256 of its files, verified on restore

    def __post_init__(self):
        check_fields(self)


def check_workdir(path: Path | str, name: str = "--workdir") -> None:
    """VtError, before anything is written, unless `path` is new, empty, or a learner's workdir (is_run_dir): a
    model checkpoint written into would no longer match its seal, and a foreign tree would get checkpoints and
    metrics mixed into it."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise VtError(f"{name} {path}: exists and is not a directory")
    if not any(path.iterdir()) or is_run_dir(path):
        return
    if is_sealed(path) or (path / CONFIG_FILE).is_file():
        raise VtError(f"{name} {path}: is a model checkpoint, not a training workdir (writing into it would break "
                      "it); start from it with --config.model.init_checkpoint and give a new --workdir")
    raise VtError(f"{name} {path}: is not empty and not a vt training workdir (it has no {CHECKPOINTS_DIR}/ or run "
                  "config.json); give a new or empty directory, or the workdir of the run to resume")


@dataclasses.dataclass
class Restored:
    step: int
    params: dict
    opt_state: Any
    meta: dict


def seal(step_dir: Path, step: int, model_cfg: ModelConfig, checksum: bool = True, keep_config: bool = False) -> None:
    """Write model_config.json (unless `keep_config`: the one already there), then the seal (vt.checkpoint.seal):
    a sealed step is complete."""
    step_dir = Path(step_dir)
    if not keep_config:
        (step_dir / "model_config.json").write_text(json.dumps(model_cfg.to_dict(), indent=2))
    write_seal(step_dir, hashed=checksum, step=step)


def _valid_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def crash_test_point(name: str, step: int) -> None:
    """Fault injection for the crash-consistency tests: SIGKILL this process at the named point of saving `step`
    when VT_TEST_KILL_AT is "<name>:<step>", or at the first time the point is reached while saving a step >= N
    when it is "<name>:<N>+" (the only way to hit a window of microseconds deterministically). The "+" form is
    for points that depend on timing: whether Orbax has retired a step into the trash by the time a given save
    starts is up to its background thread, so "deleting old steps while saving step 5" may not happen at all."""
    spec = os.environ.get("VT_TEST_KILL_AT", "")
    at_least = spec.endswith("+")
    point, _, n = spec.rstrip("+").rpartition(":")
    if point == name and n.isdigit() and (step >= int(n) if at_least else step == int(n)):
        os.kill(os.getpid(), signal.SIGKILL)


def committed_by_orbax(step_dir: Path) -> bool:
    """Whether Orbax finished (committed) this step directory: its commit marker is there, or (Orbax versions
    without one) the step metadata carries the commit timestamp Orbax writes just before its final rename."""
    if (step_dir / _COMMIT_FILE).is_file():
        return True
    try:
        meta = json.loads((step_dir / _STEP_METADATA).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and bool(meta.get("commit_timestamp_nsecs"))


class CheckpointManager:
    """Save/restore full train states under `directory`. Single writer per directory."""

    def __init__(self, directory: Path | str, cfg: CheckpointConfig, model_cfg: ModelConfig):
        if cfg.best_mode not in ("min", "max"):
            raise VtError(f"checkpoint.best_mode={cfg.best_mode!r}: expected 'min' or 'max'")
        self.directory = Path(directory).absolute()
        self.cfg, self.model_cfg = cfg, model_cfg
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cleaned, self.recovered = self._recover() if jax.process_index() == 0 else ([], [])
        policies = [pp.LatestN(n=cfg.keep)]
        if cfg.best_metric:
            metric = cfg.best_metric
            policies.append(pp.BestN(get_metric_fn=lambda m: m[metric], reverse=cfg.best_mode == "min", n=1,
                                     keep_checkpoints_without_metrics=False))
        self._pending: list[int] = []
        self._in_flight: int | None = None  # the step of the async save Orbax may still be writing
        self._lock = threading.Lock()
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies),
            enable_async_checkpointing=cfg.async_save,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._seal_in_flight) if cfg.async_save else None,
            todelete_subdir=TRASH_DIR,
            create=True,
        )
        self._mgr = ocp.CheckpointManager(self.directory, options=options)

    # --- start-up recovery ------------------------------------------------------------------------------------
    def _recover(self) -> tuple[list[str], list[str]]:
        """Make the directory hold only whole, sealed steps, with no human needed after any kill:
        - Orbax's temporary directories (a save that never committed) are removed;
        - a step Orbax committed but nobody sealed is refused (VtError): the seal is written before Orbax's
          commit (async saves), so such a step is not a crash window but a deleted seal (or an older vt's step),
          and sealing it now would vouch for whatever its files hold. With --trust-checkpoint
          (seal.set_verify(False)) it is accepted: complete by Orbax's commit marker, sealed now;
        - a sealed step whose files are partly gone (a deletion by an older vt, killed midway) is removed;
        - steps retired to the trash are deleted.
        Returns (removed, sealed) directory names."""
        removed, sealed = [], []
        for p in sorted(self.directory.iterdir()):
            if _TMP_MARK in p.name:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
            elif p.is_dir() and _STEP_RE.match(p.name):
                if is_sealed(p):
                    try:
                        partly_deleted = bool(missing_files(p, read_seal(p, f"checkpoint step {p.name}")))
                    except VtError:  # an unreadable seal is damage for restore's verification to report
                        partly_deleted = False
                    if partly_deleted:
                        shutil.rmtree(p, ignore_errors=True)
                        removed.append(f"{p.name} (partly deleted)")
                elif committed_by_orbax(p) and all((p / item).is_dir() for item in _ITEMS):
                    if verify_enabled():
                        raise VtError(f"checkpoint step {p.name} ({p}): committed but not sealed ({CHECKSUM_FILE} "
                                      f"missing), so its files cannot be verified; delete {p} to resume from the "
                                      "step before it, or resume with --trust-checkpoint to accept it as it is")
                    seal(p, int(p.name), self.model_cfg, self.cfg.checksum,
                         keep_config=_valid_json(p / "model_config.json"))
                    sealed.append(p.name)
                else:
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p.name)
        self._empty_trash()
        if removed:
            log.warning("removed incomplete checkpoints left by an interrupted run: %s", ", ".join(removed))
        if sealed:
            log.warning("sealed checkpoints that Orbax had committed before the run was interrupted: %s",
                        ", ".join(sealed))
        return removed, sealed

    def _empty_trash(self, saving: int | None = None) -> None:
        trash = self.directory / TRASH_DIR
        if trash.is_dir():
            for p in trash.iterdir():
                if saving is not None:
                    crash_test_point("deleting-old-step", saving)
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    # --- queries ------------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sealed_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def _what(self, step: int | None) -> str:
        return f"checkpoint step {step} ({self.step_dir(step)})" if step is not None else str(self.directory)

    # --- save ---------------------------------------------------------------------------------------------------
    def save(self, step: int, state, data_iterator=None, metrics: dict | None = None, rollouts=None) -> bool:
        """Start saving `state` (a TrainState) as `step`, with the data iterator's and the rollout buffer's state
        (get_state) when given; returns at once when async. `metrics` (scalars) feed the best-checkpoint
        policy. A step that already exists is not saved again."""
        if step in self._mgr.all_steps():
            return False
        self._wait_in_flight()  # Orbax waits for the previous save anyway; its error is named by its step here
        self._seal_committed(saving=step)  # a sync save (or a missed callback) leaves its predecessor to seal
        items = dict(
            params=ocp.args.PyTreeSave(state.params),
            opt_state=ocp.args.PyTreeSave(state.opt_state),
            meta=ocp.args.JsonSave({"step": int(step)}),
        )
        for name, item in (("data", data_iterator), ("rollouts", rollouts)):
            if item is not None:
                items[name] = _state_args()[0](item)
        metric = None
        if self.cfg.best_metric and metrics and self.cfg.best_metric in metrics:
            metric = {self.cfg.best_metric: float(metrics[self.cfg.best_metric])}
        with self._lock:
            self._pending.append(step)
        with writing(self._what(step)):
            if self.cfg.async_save:
                self._in_flight = step
            saved = self._mgr.save(step, args=ocp.args.Composite(**items), metrics=metric, force=True)
        if not self.cfg.async_save:
            self._seal_committed(saving=step)
        return saved

    def _wait_in_flight(self) -> None:
        """Block until Orbax has written the save in flight; its error (a full disk) raised naming the step."""
        with writing(self._what(self._in_flight)):
            self._mgr.wait_until_finished()
        self._in_flight = None

    def check(self) -> None:
        """Raise the error of a background save that failed (a full disk) now, rather than at the next save
        (maybe thousands of steps later) or at the end. Cheap (a flag read) while a save is being written."""
        if self._in_flight is not None and not self._mgr.is_saving_in_progress():
            self._wait_in_flight()

    def _seal_in_flight(self) -> None:
        """Orbax's post-finalisation callback: every item of the step in flight is written, and Orbax has not yet
        renamed its temporary directory to the step's name. Sealing the temporary directory now makes the step
        appear (Orbax's atomic rename) already sealed: there is no moment at which a finished step sits
        unsealed. Should the temporary directory not be found (another Orbax layout), the step is sealed once it
        appears (_seal_committed), and a kill in between is recovered at start-up (_recover)."""
        if jax.process_index() != 0:
            return
        # The step in flight is the pending one with a temporary directory: the next save has queued its step
        # already (it waits in Orbax for this one), but its temporary directory does not exist yet.
        with self._lock:
            pending = sorted(self._pending)
        for step in pending:
            tmps = [p for p in self.directory.glob(f"{step}{_TMP_MARK}*") if p.is_dir()]
            if len(tmps) == 1 and not self.step_dir(step).exists():
                seal(tmps[0], step, self.model_cfg, self.cfg.checksum)
                crash_test_point("sealed-before-commit", step)
                with self._lock:
                    self._pending.remove(step)
                return

    def _seal_committed(self, saving: int | None = None) -> None:
        """Seal pending steps Orbax has committed (renamed to their final name) and empty the trash."""
        if jax.process_index() != 0:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        for step in pending:
            d = self.step_dir(step)
            if d.is_dir():
                if not is_sealed(d):
                    try:
                        with writing(f"the seal of {self._what(step)}"):
                            seal(d, step, self.model_cfg, self.cfg.checksum)
                    except FileNotFoundError:
                        if d.exists():
                            raise  # else Orbax retired the step (keep) while it was being sealed: nothing to seal
            else:  # not committed yet: try again at the next opportunity
                with self._lock:
                    self._pending.append(step)
        self._empty_trash(saving)

    def wait(self) -> None:
        """Block until every started save is on disk and sealed."""
        self._wait_in_flight()
        self._seal_committed()

    def close(self) -> None:
        self.wait()
        self._mgr.close()

    # --- restore ------------------------------------------------------------------------------------------------
    def _check_same_model(self, d: Path, step: int) -> None:
        """A resume with another model (size) is named as such, before Orbax's tree-mismatch text."""
        if not (d / CONFIG_FILE).is_file():
            return  # verification names the missing file
        stored = architecture(load_model_config(d))
        wanted = architecture(self.model_cfg)
        diff = [f"{k}={stored.get(k)} (this run: {wanted.get(k)})" for k in sorted(set(stored) | set(wanted))
                if stored.get(k) != wanted.get(k)]
        if diff:
            raise VtError(f"checkpoint step {step} ({d}) holds another model: {', '.join(diff[:4])}; resume with "
                          f"the model it was trained with, or use a new --workdir")

    def restore(self, step: int, abstract_state, data_iterator=None, rollouts=None) -> Restored:
        """Verify the seal of `step`, then restore params and optimiser state straight into the shardings of
        `abstract_state` (ShapeDtypeStructs), and the data iterator's position and the rollout buffer (in place,
        set_state)."""
        d = self.step_dir(step)
        self._check_same_model(d, step)
        def target(tree):
            return ocp.args.PyTreeRestore(item=tree, restore_args=ocp.checkpoint_utils.construct_restore_args(tree))
        items = dict(params=target(abstract_state.params), opt_state=target(abstract_state.opt_state),
                     meta=ocp.args.JsonRestore())
        for name, item, what in (("data", data_iterator, "data-iterator state"),
                                 ("rollouts", rollouts, "rollout buffer")):
            if item is not None:
                if not (d / name).is_dir():
                    raise VtError(f"checkpoint step {step} ({d}) has no {what} to resume from")
                items[name] = _state_args()[1](item)
        try:
            # The seal is checked while Orbax reads the same files; a damaged file is reported by the seal.
            with BackgroundVerify(d, f"checkpoint step {step}", hint=f"delete {d} to resume from an earlier step"):
                out = self._mgr.restore(step, args=ocp.args.Composite(**items))
        except VtError:
            raise
        except Exception as e:  # orbax/tensorstore raise many types; name the step and the cause
            raise VtError(f"checkpoint step {step} ({d}): cannot restore ({reader_error(e)})") from None
        meta = dict(out["meta"])
        if meta.get("step") != step:
            raise VtError(f"checkpoint step {step} ({d}): meta says step {meta.get('step')}")
        # Checkpoints written before TrainState lost its unused RNG still hold meta["rng"]: ignored.
        return Restored(step=step, params=out["params"], opt_state=out["opt_state"], meta=meta)


# --- the data iterator's and the rollout buffer's state ----------------------------------------------------------

def _shard_file(shard: int | str, num_shards: int) -> str:
    return f"shard_{shard}-of-{num_shards}.json"


def _process_file() -> str:
    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


class StateHandler:
    """Orbax handler for an item with get_state / set_state (JSON): the data iterator (a grain DatasetIterator)
    or the RL rollout buffer. One file per logical shard for the iterators of vt.data.shards (whichever process
    owns a shard at restore reads it, so any process count that divides num_shards can resume), else one file
    per process, as grain's own handler. Every process calls save/restore with its own item; processes own
    disjoint shards, so no file is written twice."""

    def save(self, directory, item=None, args=None):
        item = item or args.item
        state = item.get_state()
        if not is_sharded_state(state):
            (directory / _process_file()).write_text(json.dumps(state, indent=1))
            return
        n = int(state["num_shards"])
        for shard, shard_state in state[STATE_KEY].items():
            (directory / _shard_file(shard, n)).write_text(json.dumps(shard_state, indent=1))

    def restore(self, directory, item=None, args=None):
        item = item or args.item
        template = item.get_state()  # which shards this process owns now
        sharded = is_sharded_state(template)
        n = int(template["num_shards"]) if sharded else 0
        paths = {shard: directory / _shard_file(shard, n) for shard in template[STATE_KEY]} if sharded \
            else {"": directory / _process_file()}
        for p in paths.values():
            if not p.exists():
                written = sorted(x.name for x in directory.iterdir())
                raise VtError(f"{p} does not exist; the checkpoint's data state holds {written} (a run resumes "
                              f"with the same data.num_shards, on any process count that divides it)")
        if sharded:
            state = {"num_shards": n, STATE_KEY: {shard: json.loads(p.read_text()) for shard, p in paths.items()}}
        else:
            state = json.loads(paths[""].read_text())
        item.set_state(state)
        if hasattr(item, "start_prefetch"):  # a grain iterator reads ahead again from its restored position
            item.start_prefetch()
        return item

    def structure(self, directory):
        return None

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass

    @classmethod
    def typestr(cls):
        return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def _state_args():
    """(save args, restore args) classes for StateHandler, registered with Orbax on first use."""
    @ocp.args.register_with_handler(StateHandler, for_save=True)
    @dataclasses.dataclass
    class StateSave(ocp.args.CheckpointArgs):
        item: Any

    @ocp.args.register_with_handler(StateHandler, for_restore=True)
    @dataclasses.dataclass
    class StateRestore(ocp.args.CheckpointArgs):
        item: Any

    return StateSave, StateRestore
