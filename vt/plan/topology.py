"""TPU topologies by the names users type (the Cloud TPU accelerator types: v5p-8, v6e-8, v5litepod-8, ...), the
JAX topology each maps to, its per-chip HBM, and compile-only devices for it (libtpu, no TPU needed).

Cloud TPU names count TensorCores for v4 and v5p (two a chip: v5p-8 is 4 chips) and chips for v5e and v6e
(v6e-8 is 8 chips). JAX names the chip grid: v5p:2x2x1, v6e:2x4. Hosts hold 4 chips (2x2), except v5e-8 and
v6e-8 (and smaller), single hosts of up to 8; a larger slice is a multi-host slice: its compile-only devices carry
their process indices, and a program compiled over all of them is the one each host runs in the multi-process
job.

NVIDIA GPUs too (h100-8: one host of 8 H100s, h100-16: two), through the jax-cuda plugin's deviceless compile: its
topology takes an XLA GPU target config (vt.plan.gpu_targets) in place of a GPU to ask.
"""
from __future__ import annotations

import dataclasses
from importlib.util import find_spec

from jax.experimental import topologies

from vt import VtError
from vt.plan import gpu_targets

GB = 10 ** 9


@dataclasses.dataclass(frozen=True)
class Generation:
    jax_name: str  # the prefix of JAX's topology names
    hbm_bytes: int  # per chip
    cores_per_chip: int  # what the user's count counts: 2 = TensorCores (v4, v5p), 1 = chips (v5e, v6e)
    grids: dict  # chips -> JAX's grid of that many chips
    single_host_chips: int = 4  # the largest slice one host holds


_CUBES = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
          512: "8x8x8"}
_PLANES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}

GENERATIONS = {
    "v4": Generation("v4", 32 * GB, 2, _CUBES),
    "v5p": Generation("v5p", 95 * GB, 2, _CUBES),
    "v5e": Generation("v5e", 16 * GB, 1, _PLANES, single_host_chips=8),
    "v6e": Generation("v6e", 32 * GB, 1, _PLANES, single_host_chips=8),
}
ALIASES = {"v5litepod": "v5e"}


@dataclasses.dataclass(frozen=True)
class Gpu:
    hbm_bytes: int
    target_config: str  # XLA's GpuTargetConfigProto text
    per_host: int = 8


GPUS = {"h100": Gpu(80 * GB, gpu_targets.H100_SXM)}  # H100 SXM 80 GB


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str  # as the user typed it, e.g. v5p-8
    jax_name: str  # e.g. v5p:2x2x1
    chips: int
    hbm_bytes: int  # per chip
    single_host: bool
    platform: str = "tpu"


def names() -> list[str]:
    """Every accelerator type `parse` accepts, for error messages and --help."""
    out = []
    for gen_name, gen in GENERATIONS.items():
        out += [f"{gen_name}-{chips * gen.cores_per_chip}" for chips in gen.grids]
    return out + [f"{name}-N (N <= {gpu.per_host} or a multiple)" for name, gpu in GPUS.items()]


def parse(name: str) -> Topology:
    """The topology of an accelerator type (`v5p-8`, `v6e-256`, `v5litepod-8`), or VtError naming the choices."""
    gen_name, _, count = name.strip().lower().partition("-")
    gen_name = ALIASES.get(gen_name, gen_name)
    gpu = GPUS.get(gen_name)
    if gpu is not None and count.isdigit() and int(count) > 0 and (
            int(count) <= gpu.per_host or int(count) % gpu.per_host == 0):
        n = int(count)
        hosts, per_host = (1, n) if n <= gpu.per_host else (n // gpu.per_host, gpu.per_host)
        # the jax-cuda plugin's topology: <partitions>x<hosts per partition>x<devices per host>
        return Topology(name, f"1x{hosts}x{per_host}", n, gpu.hbm_bytes, hosts == 1, platform="cuda")
    gen = GENERATIONS.get(gen_name)
    if gen is None or not count.isdigit() or int(count) % gen.cores_per_chip \
            or int(count) // gen.cores_per_chip not in gen.grids:
        raise VtError(f"--topology {name!r}: unknown topology; one of {', '.join(names())} "
                      "(v5litepod-N = v5e-N)")
    chips = int(count) // gen.cores_per_chip
    return Topology(name, f"{gen.jax_name}:{gen.grids[chips]}", chips, gen.hbm_bytes, chips <= gen.single_host_chips)


def devices(topology: Topology) -> list:
    """Compile-only devices of `topology` (libtpu's topology description; no TPU needed), or VtError saying how
    to install libtpu. A chip may appear as one device or, on v4, as one per TensorCore: callers divide the
    chips' HBM by devices per chip."""
    if topology.platform == "cuda":
        return _gpu_devices(topology)
    try:
        import libtpu  # noqa: F401  (get_topology_desc's own error without it is a long C++ trace)
    except ImportError:
        raise VtError("compiling for a TPU topology needs libtpu: pip install 'vt[tpu]' "
                      "(or pip install 'jax[tpu]')") from None
    grid = [int(x) for x in topology.jax_name.partition(":")[2].split("x")]
    # libtpu's default host is 2x2 chips: a single-host slice of 8 (v5e-8, v6e-8) says so
    kw = dict(chips_per_host_bounds=(grid + [1])[:3]) if topology.single_host and topology.chips > 4 else {}
    try:
        return list(topologies.get_topology_desc(topology_name=topology.jax_name, platform="tpu", **kw).devices)
    except Exception as e:  # libtpu's errors (a lockfile held by another process, an unknown grid)
        raise VtError(f"--topology {topology.name}: libtpu could not describe {topology.jax_name}: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _gpu_devices(topology: Topology) -> list:
    if find_spec("jax_plugins.xla_cuda12") is None and find_spec("jax_plugins.xla_cuda13") is None:
        raise VtError("compiling for NVIDIA GPUs needs JAX's CUDA plugin (no GPU needed): pip install "
                      "'jax-cuda12-plugin==<jax's version>' 'jax-cuda12-pjrt==<jax's version>'")
    gen = topology.name.strip().lower().partition("-")[0]
    try:
        return list(topologies.get_topology_desc(platform="cuda", target_config=GPUS[gen].target_config,
                                                 topology=topology.jax_name).devices)
    except Exception as e:
        raise VtError(f"--topology {topology.name}: the CUDA plugin could not describe {topology.jax_name}: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def hbm_per_device(topology: Topology, n_devices: int) -> int:
    return topology.hbm_bytes * topology.chips // n_devices
