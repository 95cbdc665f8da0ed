"""Device mesh and the one table that maps logical axis names to mesh axes.

Every parameter of the model carries logical axis names as metadata (`axes=("embed", "mlp")`); activations are
constrained with the same names. This module turns names into `PartitionSpec`s with `LOGICAL_RULES`. A name
missing from the table, a parameter without names, or a spec that uses one mesh axis twice is an error: nothing
is replicated silently.

Mesh axes: `data` (pure data parallel: params replicated), `fsdp` (data parallel with params, grads and optimiser
state sharded, ZeRO-3 style), `tensor` (Megatron tensor parallel over heads and the MLP hidden dimension).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Annotated, Any, Iterator, Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt import VtError
from vt.validation import FieldError, Range, check_fields

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated). The single source of truth.
# Parameters and activations use separate names: a weight's `embed` dimension is FSDP-sharded, while an
# activation's batch dimension already uses `fsdp`, so its embed dimension must not.
LOGICAL_RULES: Mapping[str, Any] = {
    # activations
    "batch": ("data", "fsdp"),
    "sequence": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    # parameters
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "cache_sequence": None,
    # the leading axis of the scanned decoder stack (weights [L, ...], KV cache [L, B, S, K, H]): every device
    # holds all layers of its shard, since the scan visits each layer on every device
    "layers": None,
    # the rank of a LoRA adapter (vt.model.lora): small, never split; the adapter's other axes follow its kernel's
    "lora_rank": None,
}


MESH_SIZE = Range(ge=-1)  # -1: the devices the other axes leave; 0 is refused separately


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes. -1 in one axis means 'all remaining devices'."""
    data: Annotated[int, MESH_SIZE] = 1
    fsdp: Annotated[int, MESH_SIZE] = -1
    tensor: Annotated[int, MESH_SIZE] = 1

    def __post_init__(self):
        check_fields(self)
        for name in ("data", "fsdp", "tensor"):
            if getattr(self, name) == 0:  # inside MESH_SIZE's bounds, yet no mesh has an axis of size 0
                raise FieldError(type(self).__name__, name, "must be -1 (all remaining devices) or >= 1, got 0")
        sizes = [self.data, self.fsdp, self.tensor]
        if sizes.count(-1) > 1:
            raise VtError(f"mesh: at most one of data/fsdp/tensor may be -1, got {sizes}")


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]  # checked by MeshConfig: each -1 or >= 1, at most one -1
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % fixed:
            raise VtError(f"mesh: {len(devices)} devices do not divide by data*tensor={fixed}")
        sizes[sizes.index(-1)] = len(devices) // fixed
    if math.prod(sizes) != len(devices):
        raise VtError(f"mesh: data*fsdp*tensor = {math.prod(sizes)} but {len(devices)} devices are available")
    # `tensor` innermost: tensor-parallel collectives are the chattiest, so they go to the closest devices.
    # Auto axes: XLA's sharding propagation fills in what `constrain` leaves open (the classic pjit model).
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=auto, devices=devices)


def logical_to_spec(axes: Sequence[str | None], where: str = "array") -> P:
    """PartitionSpec for logical axis names, rejecting names without a rule and mesh axes used twice."""
    spec, used = [], set()
    for name in axes:
        if name is None:
            spec.append(None)
            continue
        if name not in LOGICAL_RULES:
            raise VtError(f"sharding: {where} uses logical axis {name!r}, which has no rule in LOGICAL_RULES")
        mesh_axes = LOGICAL_RULES[name]
        flat = () if mesh_axes is None else (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        clash = used.intersection(flat)
        if clash:
            raise VtError(f"sharding: {where} maps mesh axis {sorted(clash)} twice (logical axes {tuple(axes)})")
        used.update(flat)
        spec.append(mesh_axes)
    return P(*spec)


# Logical axes that stay whole when they do not divide over their mesh axes, instead of an error: with fewer KV
# heads than the tensor-parallel width (coder-3b has 2, tensor 4 or 8 is common at long context) every tensor
# shard keeps all KV heads, as Megatron and vLLM do; the K/V projections and the KV cache are the small part.
REPLICATE_IF_INDIVISIBLE = frozenset({"kv_heads"})


def _drop_trivial(spec: P, mesh: Mesh, shape: Sequence[int], where: str, axes: Sequence[str | None] = ()) -> P:
    """Check divisibility; a mesh axis of size 1 is dropped so specs print cleanly."""
    out = []
    for i, (dim, entry) in enumerate(zip(shape, spec)):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        names = tuple(n for n in names if mesh.shape[n] > 1)
        size = math.prod(mesh.shape[n] for n in names)
        if dim % size:
            if i < len(axes) and axes[i] in REPLICATE_IF_INDIVISIBLE:
                names = ()
            else:
                raise VtError(f"sharding: {where} has dimension {dim} that does not divide over mesh axes {names} "
                              f"(size {size}); change the mesh or pad the dimension")
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return P(*out)


def param_sharding(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, where: str) -> NamedSharding:
    if len(axes) != len(shape):
        raise VtError(f"sharding: {where} has shape {tuple(shape)} but logical axes {tuple(axes)}")
    spec = logical_to_spec(axes, where)
    return NamedSharding(mesh, _drop_trivial(spec, mesh, shape, where, axes))


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One array of a device pytree that is not a model (the KV cache, the sampler's slots), declared once: shape,
    dtype and logical axes. The tree's zeros, shardings and abstract values are derived from its ArrayInfo leaves
    (jax-llm-examples' qwen3 ArrayInfo), so a new field cannot be left out of one of them."""
    shape: tuple[int, ...]
    dtype: Any
    axes: tuple[str | None, ...]


def zeros_of(spec):
    return jax.tree.map(lambda a: jax.numpy.zeros(a.shape, a.dtype), spec)


def shardings_of(spec, mesh: Mesh, where: str):
    return jax.tree.map(lambda a: param_sharding(a.axes, a.shape, mesh, where), spec)


def abstract_of(spec, mesh: Mesh | None = None, where: str = ""):
    """ShapeDtypeStructs (placed as `shardings_of` places them when `mesh` is given): a program lowered without
    allocating."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=None if mesh is None else param_sharding(a.axes, a.shape, mesh, where)), spec)


def state_shardings(abstract_state, mesh: Mesh):
    """NamedSharding for every variable of an (abstract) nnx.State, from its `axes` metadata."""
    def one(path, var):
        where = "/".join(map(str, path))
        axes = var.get_metadata().get("axes")
        if axes is None:
            raise VtError(f"sharding: parameter {where} has no logical axes; every parameter must declare them")
        return param_sharding(axes, var.get_value().shape, mesh, where)

    return nnx.map_state(one, abstract_state)


# --- the hardware ------------------------------------------------------------------------------------------------

def platform(mesh=None) -> str:
    """The platform ("tpu", "gpu", "cpu") of the devices a program is built for: `mesh`'s devices, else those of
    the mesh being traced or built under (`use_mesh` / `jax.set_mesh`), else JAX's default backend. Every choice
    that depends on the hardware (attention implementation, decode kernel, Pallas interpret mode) reads this, so a
    program compiled for a TPU topology from a CPU host (`vt plan`) takes exactly the paths a pod runs, while a
    program built with no mesh runs as before, on the default backend."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        if isinstance(mesh, Mesh):
            return mesh.devices.flat[0].platform
        device = getattr(mesh, "abstract_device", None)  # an AbstractMesh made by hand may carry none
        if device is not None and device.platform:
            return device.platform
    return jax.default_backend()


def is_cuda(mesh=None) -> bool:
    """Are the devices programs are built for NVIDIA GPUs (not ROCm)? (cuDNN's attention applies there.)"""
    if platform(mesh) != "gpu":
        return False
    if not isinstance(mesh, Mesh):
        abstract = jax.sharding.get_abstract_mesh()
        device = None if abstract.empty else getattr(abstract, "abstract_device", None)
        if device is not None and device.device_kind:  # inside jit (no concrete mesh to ask): ROCm's are AMD's
            return not device.device_kind.lower().startswith("amd")
    concrete = mesh if isinstance(mesh, Mesh) else jax.sharding.get_mesh()
    device = concrete.devices.flat[0] if not concrete.empty else jax.devices()[0]
    return "cuda" in device.client.platform_version.lower()


# --- activations ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def use_mesh(mesh: Mesh) -> Iterator[Mesh]:
    """Make `mesh` current for tracing inside the block: activation constraints in the model resolve against it.
    (`jax.set_mesh` alone would set it already when called, and for good if the block were never entered.)"""
    with jax.set_mesh(mesh):
        yield mesh


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Pin an activation's sharding by logical names. Outside `use_mesh` (single device, no mesh) there is
    nothing to pin and x is returned as is."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, activation_spec(x.shape, axes, mesh))


def activation_spec(shape: Sequence[int], axes: Sequence[str | None], mesh) -> P:
    """PartitionSpec of an activation of `shape` named by logical `axes` (LOGICAL_RULES). Dimensions that do not
    divide over their mesh axes (e.g. batch 1 while decoding a single prompt) stay replicated. `mesh` is a Mesh or the abstract mesh of `jax.sharding.get_abstract_mesh()`."""
    spec = logical_to_spec(axes, "activation")
    fixed = []
    for dim, entry in zip(shape, spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        fixed.append(entry if dim % math.prod(mesh.shape[n] for n in names) == 0 else None)
    return P(*fixed)
