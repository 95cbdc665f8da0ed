"""Multi-host start-up: one call to `initialize()` before anything touches a JAX backend.

vt runs on JAX's own multi-controller runtime: every host runs the same program, `jax.distributed` connects the
processes, `jax.devices()` then lists every process's devices, and a mesh built from it spans the whole slice
(vt.sharding.make_mesh). There is no other orchestration. How the processes find each other, first match wins:

  1. explicit: the arguments of `initialize(coordinator, num_processes, process_id)`, else the environment
     variables JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID
     (launch/local.sh sets them);
  2. SLURM: inside an `srun` step (SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID
     all set) jax.distributed's own SLURM detection supplies everything (launch/gpu_slurm.sbatch). It gives each
     process the GPU numbered SLURM_LOCALID; with one process per host set JAX_LOCAL_DEVICE_IDS=0,1,...;
  3. Cloud TPU VM (Google TPU PCI devices present): jax.distributed's own TPU detection asks the metadata server
     for the workers of the slice (launch/tpu_pod.sh);
  4. otherwise: one process, nothing to connect.

VT_DISTRIBUTED=off skips 2 and 3 (e.g. a one-off single-process tool inside an srun step); explicit settings
(1) always win. A partial explicit setting (an address without a process id, say) is an error, not a guess.

Only process 0 writes metrics and logs (`is_primary()`); checkpoints are written by all processes together
(Orbax), and `barrier(name)` lines processes up around the few filesystem steps that must happen once.

Also the one home of the multi-process helpers every learner and tool shares:
  - `process_mesh(cfg, devices)`: a mesh over this process's own devices, or some of them (per-process sampling,
    evaluation, scoring; the RL sampler's sub-mesh);
  - `allgather(x)`: a host value from every process, in process order;
  - `global_batch(host_rows, shardings)`: global arrays whose rows are every process's host rows;
  - `MeshProgram`: a function compiled ahead of time on a mesh (the one place a jitted call enters the mesh);
  - `enable_compilation_cache(dir)`: the persistent compilation cache;
  - `peak_flops_per_device()`: the devices' peak FLOP/s (`PEAK_FLOPS`), for MFU;
and the one documented list of XLA flags for NVIDIA GPUs (`NVIDIA_XLA_FLAGS`, printed for shell scripts by
`python -m vt.distributed nvidia-env`).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from vt import VtError
from vt.cluster import detect
from vt.sharding import MESH_AXES, MeshConfig, use_mesh

@dataclasses.dataclass(frozen=True)
class DistributedInfo:
    method: str  # "explicit" | "slurm" | "tpu" | "single"
    process_index: int
    process_count: int
    coordinator: str | None = None


_INFO: DistributedInfo | None = None


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               *, timeout_s: int = 300) -> DistributedInfo:
    """Connect this process to the others (see the module docstring for how); call once, first thing.

    Calling again returns the same answer; a second call asking for something else is an error."""
    global _INFO
    method, kwargs = detect(coordinator, num_processes, process_id)
    if _INFO is not None:
        wanted = kwargs.get("num_processes"), kwargs.get("process_id")
        if method == "explicit" and wanted != (_INFO.process_count, _INFO.process_index):
            raise VtError(f"distributed: already initialised as process {_INFO.process_index} of "
                          f"{_INFO.process_count}; cannot re-initialise as {wanted[1]} of {wanted[0]}")
        return _INFO
    if method == "single":
        _INFO = DistributedInfo("single", 0, 1)
        return _INFO
    # Cross-process collectives between CPU devices (the local rehearsal of a pod) need an implementation;
    # GPU and TPU bring their own (NCCL, ICI) and ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(initialization_timeout=timeout_s, **kwargs)
    except RuntimeError as e:
        raise VtError(f"distributed ({method}): {str(e).splitlines()[0]} (initialize() must run before "
                      "anything uses a JAX device)") from None
    except (ValueError, TypeError) as e:
        raise VtError(f"distributed ({method}): cannot start: {e}") from None
    _INFO = DistributedInfo(method, jax.process_index(), jax.process_count(), kwargs.get("coordinator_address"))
    return _INFO


def is_primary() -> bool:
    """True on process 0: the one process that writes metrics, logs and single-writer files."""
    if process_count() == 1:
        return True
    return jax.process_index() == 0


def process_count() -> int:
    if _INFO is None and detect()[0] == "single":
        initialize()  # nothing to connect (the CLI starts only multi-process runs: vt.cluster)
    if _INFO is not None and _INFO.method == "single":
        return 1  # started as one process: no need to start a backend to ask
    return jax.process_count()


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier called `name` (no-op with one process)."""
    if process_count() == 1:
        return
    multihost_utils.sync_global_devices(name)


# --- compilation cache ------------------------------------------------------------------------------------------

def enable_compilation_cache(directory: str | os.PathLike, *, min_compile_time_s: float = 1.0) -> None:
    """Persist compiled executables in `directory` (local path or gs://...), so a restart, a requeued job or the
    next run of the same shapes skips XLA compilation. Programs that compile faster than `min_compile_time_s`
    are not worth a file. Same as setting JAX_COMPILATION_CACHE_DIR (which jax reads itself) before start-up;
    on a pod point every host at the same shared directory."""
    if not str(directory).startswith("gs://"):
        Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))


# --- peak FLOP/s of the devices, for MFU ---------------------------------------------------------------------------

# Dense bf16 peak FLOP/s per device, by substring of jax's device_kind. Unknown kinds report no MFU unless
# `peak_flops` is configured.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12,
              "TPU v5e": 197e12, "TPU v4": 275e12, "TPU v6": 918e12}


def peak_flops_per_device(configured: float = 0.0) -> float | None:
    if configured > 0:
        return configured
    kind = jax.devices()[0].device_kind
    for name, flops in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return None


# --- several processes: the mesh of one, gathers, the global batch -----------------------------------------------

def process_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over this process's own devices (same axis names as the learner's), for work each process does on
    its own: sampling its share of the rollouts, evaluation, scoring. `devices`: some of them instead of all
    (the RL sampler's own sub-mesh, rollout.sampler_devices).

    The config's shape when it fits this process's devices (an axis of -1 takes all of them, otherwise the first
    data * fsdp * tensor). A shape that does not fit is a mesh spanning several processes (a learner's): then
    every local device, keeping its tensor-parallel width when that divides them (long contexts need the KV
    cache split over heads) and the rest along fsdp (weights sharded, slots split over data x fsdp)."""
    local = sorted(jax.local_devices() if devices is None else devices, key=lambda d: d.id)
    n, sizes = len(local), [cfg.data, cfg.fsdp, cfg.tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise VtError(f"mesh: sizes must be positive with at most one -1, got data={cfg.data} fsdp={cfg.fsdp} "
                      f"tensor={cfg.tensor}")
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes and n % fixed == 0:
        sizes[sizes.index(-1)] = n // fixed
    elif -1 in sizes or fixed > n:
        tensor = cfg.tensor if cfg.tensor > 0 and n % cfg.tensor == 0 else 1
        sizes = [1, n // tensor, tensor]
    # Devices in id order, built directly: LocalReplicas lays every process's devices out the same way.
    devices = np.array(local[:math.prod(sizes)]).reshape(sizes)
    return Mesh(devices, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def allgather(x) -> np.ndarray:
    """[P, *x.shape]: the host value x from every process, in process order (x[None] on one process)."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    return np.asarray(multihost_utils.process_allgather(x))


def global_batch(host_rows: dict[str, np.ndarray], shardings: NamedSharding | dict[str, NamedSharding],
                 row_axis: int = 0) -> dict[str, jax.Array]:
    """Global arrays whose rows (axis `row_axis`) are every process's `host_rows`, process by process: each
    process passes only its own share of the global batch. `shardings`: one for every key, or one per key."""
    count = jax.process_count()

    def put(k, v):
        sh = shardings[k] if isinstance(shardings, dict) else shardings
        shape = list(v.shape)
        shape[row_axis] *= count
        return jax.make_array_from_process_local_data(sh, v, tuple(shape))
    return {k: put(k, v) for k, v in host_rows.items()}


# --- compiled programs ----------------------------------------------------------------------------------------------

class MeshProgram:
    """`fn` jitted with explicit in/out shardings (and donation), compiled ahead of time on `mesh` once per
    argument signature (tree structure, shapes, dtypes) and cached: the one way vt runs a jitted function on a
    mesh. The mesh is entered only while tracing, where the model's activation constraints resolve against it;
    the compiled executable runs without it. An argument whose sharding differs from `in_shardings` is an
    error from the executable, never a silent retrace.

        step = MeshProgram(train_step, mesh, in_shardings=(state_sh, batch_sh), out_shardings=..., donate_argnums=(0,))
        step.compile(abstract_state, abstract_batch)   # optional: compile before the first call
        state, metrics = step(state, batch)
    """

    def __init__(self, fn: Callable, mesh: Mesh, *, in_shardings: Any, out_shardings: Any,
                 donate_argnums: tuple[int, ...] = ()):
        self.mesh = mesh
        self.jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                              donate_argnums=donate_argnums)
        self._compiled: dict = {}

    @staticmethod
    def _signature(args) -> tuple:
        leaves, treedef = jax.tree.flatten(args)
        return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)

    def lower(self, *args):
        """Trace and lower for `args` (arrays or ShapeDtypeStructs) on the mesh (bench/compile.py times this)."""
        with use_mesh(self.mesh):
            return self.jitted.lower(*args)

    def compile(self, *args):
        """The executable for `args`' signature (arrays or ShapeDtypeStructs), compiled now if not yet."""
        key = self._signature(args)
        exe = self._compiled.get(key)
        if exe is None:
            exe = self._compiled[key] = self.lower(*args).compile()
        return exe

    def __call__(self, *args):
        return self.compile(*args)(*args)


# --- NVIDIA GPUs: the one place for XLA flags -------------------------------------------------------------------

# XLA flags for NVIDIA GPUs (H100/H200), each with the reason it is on. Every launcher and bench script takes them
# from here (`python -m vt.distributed nvidia-env`); tests check this jaxlib's XLA knows every one of them
# (an unknown flag aborts XLA at start-up).
NVIDIA_XLA_FLAGS: dict[str, str] = {
    # Schedule collectives asynchronously around compute: FSDP's all-gathers and reduce-scatters overlap matmuls.
    "--xla_gpu_enable_latency_hiding_scheduler=true": "overlap collectives with compute",
    # Split loop-carried collectives so the next layer's all-gather runs during this layer's compute.
    "--xla_gpu_enable_pipelined_all_gather=true": "prefetch FSDP weight gathers",
    "--xla_gpu_enable_pipelined_reduce_scatter=true": "overlap gradient reduce-scatters",
    "--xla_gpu_enable_pipelined_all_reduce=true": "overlap data-parallel all-reduces",
    # cuBLASLt GEMMs match or beat the Triton GEMM emitter on Hopper for dense-decoder shapes, and skip its
    # autotuning (minutes of compile time at 3B scale).
    "--xla_gpu_enable_triton_gemm=false": "cuBLAS GEMMs",
}

# Other environment for NVIDIA GPUs: the default preallocation (75% of HBM) leaves a quarter of an H200 idle.
NVIDIA_ENV: dict[str, str] = {
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.90",
}


def merge_xla_flags(existing: str, flags: Sequence[str]) -> str:
    """`existing` XLA_FLAGS plus `flags`; a flag already set in `existing` (by name) keeps the user's value."""
    have = {f.split("=", 1)[0] for f in existing.split()}
    extra = [f for f in flags if f.split("=", 1)[0] not in have]
    return " ".join([*existing.split(), *extra])


def nvidia_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to export for a run on NVIDIA GPUs (user-set values are kept)."""
    environ = os.environ if environ is None else environ
    out = {"XLA_FLAGS": merge_xla_flags(environ.get("XLA_FLAGS", ""), list(NVIDIA_XLA_FLAGS))}
    for k, v in NVIDIA_ENV.items():
        out[k] = environ.get(k, v)
    return out


def apply_nvidia_env() -> None:
    """Set `nvidia_env()` in this process; effective only before the GPU backend starts."""
    os.environ.update(nvidia_env())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vt.distributed", description="Start-up helpers for launchers.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("nvidia-env", help="print `export K=V` lines for NVIDIA GPUs (eval them in a shell)")
    sub.add_parser("detect", help="print how initialize() would start here, without starting anything")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "nvidia-env":
            for k, v in nvidia_env().items():
                print(f"export {k}={shlex.quote(v)}")
        else:
            method, kwargs = detect()
            print(method, " ".join(f"{k}={v}" for k, v in sorted(kwargs.items())))
    except VtError as e:
        print(f"vt.distributed: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
