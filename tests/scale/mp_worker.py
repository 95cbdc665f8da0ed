"""One process of a multi-process check, started by launch/local.sh (or alone for the 1-process reference).

    python tests/scale/mp_worker.py train   --out OUT.npz [--save CKPT] [--restore CKPT --restore-out R.npz]
    python tests/scale/mp_worker.py restore --ckpt CKPT --out OUT.npz [--ckpt ... --out ...] --mesh D,F,T
        [--train-state WORKDIR:STEP --train-state-out OUT.npz --config SPEC --override=--config.x=y ...]

`train` runs the real compiled SFT step (vt.train.step) for a few steps on a (data 2, fsdp 2, tensor 2) mesh.
The global batch is the same whatever the process count: the rows of two data shards, process p feeding shard p
when there are two processes and one process feeding both otherwise. Process 0 writes the per-step losses and
the final parameters (gathered) to OUT.npz; `--save` writes the trained parameters as a model checkpoint
(collectively); `--restore` loads a checkpoint onto this run's mesh and writes what it read. `restore` reads
model checkpoints, and optionally a learner checkpoint of `vt train`, onto the mesh given.
"""
from __future__ import annotations

import argparse
import sys

from vt.distributed import initialize

INFO = initialize()  # from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, before any device use

import jax  # noqa: E402
import numpy as np  # noqa: E402

from vt.distributed import is_primary  # noqa: E402
from vt.model.config import preset  # noqa: E402
from vt.model.qwen2 import create_model  # noqa: E402
from vt.sharding import MeshConfig, make_mesh  # noqa: E402

SHARDS, STEPS, SEQ, GLOBAL_ROWS, ACCUM = 2, 3, 64, 8, 2


def gather(tree: dict) -> dict[str, np.ndarray]:
    from jax.experimental import multihost_utils
    out = {}
    for k, v in tree.items():
        out[k] = np.asarray(multihost_utils.process_allgather(v, tiled=True) if not v.is_fully_addressable
                            else jax.device_get(v))
    return out


def local_batches(vocab: int):
    """This process's rows of each global batch: shards p, p+P, ... of SHARDS, concatenated along rows."""
    from vt.train.synthetic import SyntheticTask, synthetic_dataset
    mine = range(jax.process_index(), SHARDS, jax.process_count())
    its = [iter(synthetic_dataset(SyntheticTask(), seq_len=SEQ, global_batch_size=GLOBAL_ROWS,
                                  grad_accum_steps=ACCUM, seed=0, vocab_size=vocab,
                                  process_index=s, process_count=SHARDS)) for s in mine]
    while True:
        parts = [next(it) for it in its]
        yield {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}


def write(path: str, arrays: dict) -> None:
    if is_primary():
        np.savez(path, **arrays)


def train(args) -> None:
    from vt.checkpoint.params import flat_params, load_model, save_model
    from vt.train.optim import OptimConfig, make_optimizer
    from vt.train.state import ModelDef, abstract_train_state, init_train_state, train_state_shardings
    from vt.distributed import global_batch
    from vt.train.step import as_microbatches, batch_sharding, make_train_step

    cfg = preset("tiny")
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    optimizer, schedule = make_optimizer(OptimConfig(lr=1e-3, final_lr=1e-4, warmup_frac=0.0, weight_decay=0.01), STEPS)
    md = ModelDef(cfg)
    sh = train_state_shardings(md, optimizer, mesh)
    state = init_train_state(flat_params(create_model(cfg, mesh, seed=0)), optimizer, sh)
    step = make_train_step(md, optimizer, schedule, sh, abstract_train_state(md, optimizer, sh), mesh,
                           ACCUM, GLOBAL_ROWS // ACCUM, SEQ)
    losses, norms = [], []
    batches = local_batches(cfg.vocab_size)
    for _ in range(STEPS):
        state, m = step(state, global_batch(as_microbatches(next(batches)), batch_sharding(mesh), row_axis=1))
        losses.append(float(m["loss"]))
        norms.append(float(m["grad_norm"]))
    params = gather(state.params)
    write(args.out, {"loss": np.array(losses), "grad_norm": np.array(norms), "processes": jax.process_count(),
                     **{f"param/{k}": v for k, v in params.items()}})
    if args.save:
        save_model(args.save, md.bind(state.params))
    if args.restore:
        model = load_model(args.restore, mesh)
        write(args.restore_out, {f"param/{k}": v for k, v in gather(flat_params(model)).items()})
    print(f"process {jax.process_index()}/{jax.process_count()} devices {jax.device_count()} "
          f"losses {losses}", flush=True)


def restore(args) -> None:
    from vt.checkpoint.params import flat_params, load_model
    data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
    mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))
    for ckpt, out in zip(args.ckpt, args.out):
        write(out, {f"param/{k}": v for k, v in gather(flat_params(load_model(ckpt, mesh))).items()})
    if args.train_state:
        restore_train_state(args, mesh)


def restore_train_state(args, mesh) -> None:
    """A learner checkpoint (params + AdamW moments) restored onto `mesh` with the run's own config."""
    from vt.checkpoint.manager import CheckpointManager
    from vt.config import load_config, to_dataclass
    from vt.train.optim import make_optimizer
    from vt.train.loop import resolve_model_config
    from vt.train.sft import SftConfig
    from vt.train.state import ModelDef, abstract_train_state, train_state_shardings

    workdir, step = args.train_state.rsplit(":", 1)
    cfg = to_dataclass(SftConfig, load_config(args.config, args.override))
    optimizer, _ = make_optimizer(cfg.optim, cfg.train.steps)
    md = ModelDef(resolve_model_config(cfg.model))
    sh = train_state_shardings(md, optimizer, mesh)
    manager = CheckpointManager(f"{workdir}/checkpoints", cfg.checkpoint, md.cfg)
    try:
        r = manager.restore(int(step), abstract_train_state(md, optimizer, sh))
    finally:
        manager.close()
    leaves = {f"opt/{i}": v for i, v in enumerate(jax.tree.leaves(r.opt_state)) if getattr(v, "ndim", 0) >= 1}
    write(args.train_state_out, {**{f"param/{k}": v for k, v in gather(r.params).items()}, **gather(leaves),
                                 "step": r.step})


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True)
    t.add_argument("--save", default="")
    t.add_argument("--restore", default="")
    t.add_argument("--restore-out", default="")
    r = sub.add_parser("restore")
    r.add_argument("--ckpt", action="append", default=[], help="model checkpoint (repeatable, pairs with --out)")
    r.add_argument("--out", action="append", default=[])
    r.add_argument("--mesh", default="1,8,1")
    r.add_argument("--train-state", default="", help="WORKDIR:STEP of a `vt train` run")
    r.add_argument("--train-state-out", default="")
    r.add_argument("--config", default="", help="that run's config spec")
    r.add_argument("--override", action="append", default=[], help="that run's --config.x=y overrides")
    args = p.parse_args()
    train(args) if args.cmd == "train" else restore(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
