"""The learners' checkpoint manager: Orbax CheckpointManager plus what a long run needs around it.

Each step directory `DIR/<step>/` holds
    params/             the flat parameter dict, exactly as in a model checkpoint (vt.checkpoint.params)
    model_config.json   so `load_model(DIR/<step>)` and `vt convert orbax-to-hf DIR/<step> ...` work on it
    opt_state/          the optimiser state (sharded like the params)
    meta/               JSON: step and the RNG key
    data/               the data iterator's state: one file per logical data shard, shard_<s>-of-<S>.json,
                        written by the process that owns the shard and read by whichever process owns it at
                        restore (so a run resumes on another process count; vt.data.shards); an iterator
                        without logical shards: one file per process, process_<i>-of-<n>.json (as grain's)
    vt_checksums.json   sha256 of every other file, written last: its presence seals the step

Saves are asynchronous (the train loop continues while Orbax writes); the seal is written by Orbax's
post-finalisation callback once the step directory is complete. On start-up, Orbax's temporary directories
and unsealed steps (a crash between Orbax's rename and our seal) are removed and reported. A restore first
re-hashes the step: any difference is a VtError naming the step and the file, never a silently wrong value.
Retention: the newest `keep` steps, plus the best step by `best_metric` (when given).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vt import VtError
from vt.model.config import ModelConfig

log = logging.getLogger(__name__)

CHECKSUM_FILE = "vt_checksums.json"
_STEP_RE = re.compile(r"^\d+$")
_TMP_MARK = ".orbax-checkpoint-tmp"


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 1000  # save every N optimiser steps (and always at the end and on SIGTERM)
    keep: int = 3  # newest checkpoints kept; older ones are deleted (set large for checkpoint merging)
    best_metric: str = ""  # also keep the best step by this metric (e.g. "eval_loss"); "" = newest only
    best_mode: str = "min"  # "min" or "max" for best_metric
    async_save: bool = True  # write in the background while training continues
    checksum: bool = True  # seal each step with sha256 of its files, verified on restore


@dataclasses.dataclass
class Restored:
    step: int
    params: dict
    opt_state: Any
    rng: np.ndarray
    meta: dict


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _hash_tree(step_dir: Path) -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(step_dir):
        for name in files:
            p = Path(root) / name
            rel = p.relative_to(step_dir).as_posix()
            if rel != CHECKSUM_FILE:
                out[rel] = _sha256(p)
    return dict(sorted(out.items()))


def seal(step_dir: Path, step: int, model_cfg: ModelConfig, checksum: bool = True) -> None:
    """Write model_config.json, then the checksum file (atomically): a sealed step is complete."""
    step_dir = Path(step_dir)
    (step_dir / "model_config.json").write_text(json.dumps(model_cfg.to_dict(), indent=2))
    record = {"step": step, "algorithm": "sha256", "files": _hash_tree(step_dir) if checksum else None}
    tmp = step_dir / (CHECKSUM_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, step_dir / CHECKSUM_FILE)


def verify(step_dir: Path, step: int) -> None:
    """Raise VtError naming the step (and file) if the step directory differs from its seal."""
    path = Path(step_dir) / CHECKSUM_FILE
    if not path.is_file():
        raise VtError(f"checkpoint step {step} ({step_dir}): not sealed ({CHECKSUM_FILE} missing); "
                      "the save did not complete")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VtError(f"checkpoint step {step}: {path} is corrupted ({e})") from None
    if record.get("files") is None:
        return  # saved with checksum=False
    want, got = record["files"], _hash_tree(Path(step_dir))
    for rel in sorted(set(want) | set(got)):
        if want.get(rel) != got.get(rel):
            what = "missing" if rel not in got else "unexpected" if rel not in want else "checksum mismatch"
            raise VtError(f"checkpoint step {step} is corrupted: {Path(step_dir) / rel}: {what} "
                          f"(delete {step_dir} to resume from an earlier step)")


class CheckpointManager:
    """Save/restore full train states under `directory`. Single writer per directory."""

    def __init__(self, directory: Path | str, cfg: CheckpointConfig, model_cfg: ModelConfig):
        import orbax.checkpoint as ocp
        from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

        if cfg.best_mode not in ("min", "max"):
            raise VtError(f"checkpoint.best_mode={cfg.best_mode!r}: expected 'min' or 'max'")
        if cfg.keep < 1:
            raise VtError(f"checkpoint.keep={cfg.keep}: must keep at least 1 checkpoint")
        self.directory = Path(directory).absolute()
        self.cfg, self.model_cfg = cfg, model_cfg
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cleaned = self._clean_leftovers() if jax.process_index() == 0 else []
        policies = [pp.LatestN(n=cfg.keep)]
        if cfg.best_metric:
            metric = cfg.best_metric
            policies.append(pp.BestN(get_metric_fn=lambda m: m[metric], reverse=cfg.best_mode == "min", n=1,
                                     keep_checkpoints_without_metrics=False))
        self._pending: list[int] = []
        self._lock = threading.Lock()
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies),
            enable_async_checkpointing=cfg.async_save,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._seal_pending) if cfg.async_save else None,
            create=True,
        )
        self._mgr = ocp.CheckpointManager(self.directory, options=options)

    # --- start-up hygiene -------------------------------------------------------------------------------------
    def _clean_leftovers(self) -> list[str]:
        removed = []
        for p in sorted(self.directory.iterdir()):
            if _TMP_MARK in p.name or (p.is_dir() and _STEP_RE.match(p.name) and not (p / CHECKSUM_FILE).is_file()):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        if removed:
            log.warning("removed incomplete checkpoints left by an interrupted run: %s", ", ".join(removed))
        return removed

    # --- queries ------------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sorted(int(p.name) for p in self.directory.iterdir()
                      if p.is_dir() and _STEP_RE.match(p.name) and (p / CHECKSUM_FILE).is_file())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    # --- save ---------------------------------------------------------------------------------------------------
    def save(self, step: int, state, data_iterator=None, metrics: dict | None = None) -> bool:
        """Start saving `state` (a TrainState) as `step`; returns at once when async. `metrics` (scalars) feed
        the best-checkpoint policy. A step that already exists is not saved again."""
        import orbax.checkpoint as ocp

        if step in self._mgr.all_steps():
            return False
        self._seal_pending()  # a sync save (or a missed callback) leaves its predecessor to seal
        items = dict(
            params=ocp.args.PyTreeSave(state.params),
            opt_state=ocp.args.PyTreeSave(state.opt_state),
            meta=ocp.args.JsonSave({"step": int(step), "rng": np.asarray(jax.device_get(state.rng)).tolist()}),
        )
        if data_iterator is not None:
            items["data"] = _data_args()[0](data_iterator)
        metric = None
        if self.cfg.best_metric and metrics and self.cfg.best_metric in metrics:
            metric = {self.cfg.best_metric: float(metrics[self.cfg.best_metric])}
        with self._lock:
            self._pending.append(step)
        saved = self._mgr.save(step, args=ocp.args.Composite(**items), metrics=metric, force=True)
        if not self.cfg.async_save:
            self._seal_pending()
        return saved

    def _seal_pending(self) -> None:
        if jax.process_index() != 0:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        for step in pending:
            d = self.step_dir(step)
            if d.is_dir():
                seal(d, step, self.model_cfg, self.cfg.checksum)
            else:  # not finalised yet: try again at the next opportunity
                with self._lock:
                    self._pending.append(step)

    def wait(self) -> None:
        """Block until every started save is on disk and sealed."""
        self._mgr.wait_until_finished()
        self._seal_pending()

    def close(self) -> None:
        self.wait()
        self._mgr.close()

    # --- restore ------------------------------------------------------------------------------------------------
    def restore(self, step: int, abstract_state, data_iterator=None) -> Restored:
        """Verify the seal of `step`, then restore params and optimiser state straight into the shardings of
        `abstract_state` (ShapeDtypeStructs), the RNG, and the data iterator's position (in place)."""
        import orbax.checkpoint as ocp

        d = self.step_dir(step)
        verify(d, step)
        def target(tree):
            return ocp.args.PyTreeRestore(item=tree, restore_args=ocp.checkpoint_utils.construct_restore_args(tree))
        items = dict(params=target(abstract_state.params), opt_state=target(abstract_state.opt_state),
                     meta=ocp.args.JsonRestore())
        if data_iterator is not None:
            if not (d / "data").is_dir():
                raise VtError(f"checkpoint step {step} ({d}) has no data-iterator state to resume from")
            items["data"] = _data_args()[1](data_iterator)
        try:
            out = self._mgr.restore(step, args=ocp.args.Composite(**items))
        except VtError:
            raise
        except Exception as e:  # orbax/tensorstore raise many types; name the step and the cause
            raise VtError(f"checkpoint step {step} ({d}): cannot restore "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:300]})") from None
        meta = dict(out["meta"])
        if meta.get("step") != step:
            raise VtError(f"checkpoint step {step} ({d}): meta says step {meta.get('step')}")
        return Restored(step=step, params=out["params"], opt_state=out["opt_state"],
                        rng=np.asarray(meta["rng"], np.uint32), meta=meta)


# --- the data iterator's state ------------------------------------------------------------------------------------

def _shard_file(shard: int | str, num_shards: int) -> str:
    return f"shard_{shard}-of-{num_shards}.json"


def _process_file() -> str:
    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


class DataStateHandler:
    """Orbax handler for the data iterator (a grain DatasetIterator): one file per logical shard for the
    iterators of vt.data.shards (whichever process owns a shard at restore reads it, so any process count that
    divides num_shards can resume), else one file per process, as grain's own handler. Every process calls
    save/restore with its own iterator; processes own disjoint shards, so no file is written twice."""

    def save(self, directory, item=None, args=None):
        from vt.data.shards import STATE_KEY, is_sharded_state
        item = item or args.item
        state = item.get_state()
        if not is_sharded_state(state):
            (directory / _process_file()).write_text(json.dumps(state, indent=1))
            return
        n = int(state["num_shards"])
        for shard, shard_state in state[STATE_KEY].items():
            (directory / _shard_file(shard, n)).write_text(json.dumps(shard_state, indent=1))

    def restore(self, directory, item=None, args=None):
        from vt.data.shards import STATE_KEY, is_sharded_state
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
def _data_args():
    """(save args, restore args) classes for DataStateHandler, registered with Orbax on first use."""
    import orbax.checkpoint as ocp

    @ocp.args.register_with_handler(DataStateHandler, for_save=True)
    @dataclasses.dataclass
    class DataStateSave(ocp.args.CheckpointArgs):
        item: Any

    @ocp.args.register_with_handler(DataStateHandler, for_restore=True)
    @dataclasses.dataclass
    class DataStateRestore(ocp.args.CheckpointArgs):
        item: Any

    return DataStateSave, DataStateRestore
