"""LoRA adapters on the decoder's projections (Hu et al. 2021), as PEFT defines them.

    y = x W + (alpha / r) * dropout(x) A B        A [in..., r], B [r, out...]; B starts at zero, so y = x W

ModelConfig.lora_rank > 0 gives every projection whose name fully matches the regex `lora_targets` (among q, k,
v, o, gate, up, down) an adapter pair `<name>_lora_a`, `<name>_lora_b`, stacked over the layers like the kernel
they adapt ([L, in..., r], [L, r, out...]) and named by the same logical axes (the rank axis `lora_rank` is not
split), so vt.sharding places them with the kernel's input/output split. Adapters are `nnx.LoRAParam`s (a
subclass of `nnx.Param`: checkpoints and the flat params dict hold them beside the base weights, keys
"layers.attn.q_lora_a"), in float32 whatever the base weights' `param_dtype` (base weights may be bfloat16).
The learners train only the adapters (`is_adapter`); `merged_params` folds them into the kernels for export,
rollouts and `vt merge`.

Why by hand rather than qwix (`qwix.apply_lora_to_model`): qwix creates the adapter params lazily, inside the
module call it intercepts (its einsum / dot_general hook finds the kernel among the calling module's params and
adds `<kernel>_lora_a/_b` to that module). vt runs its decoder layers under `jax.lax.scan` over a module
rebuilt by `nnx.merge` from the stacked state (vt.model.qwen2.scan_layers): the module qwix would add params to
is a per-layer, traced copy inside the scan body, so the adapters would be tracers with unstacked per-layer
shapes that never reach the model's state. The adapter math itself is two einsums.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vt.model.config import PROJECTIONS, targets

RANK_AXIS = "lora_rank"


def is_adapter(key: str) -> bool:
    """Whether a flat parameter key ("layers.attn.q_lora_a") names a LoRA adapter."""
    return key.endswith(("_lora_a", "_lora_b"))


def trainable(params: dict) -> dict:
    """The entries of a flat params dict (or of a dict keyed like one) the optimiser updates: the adapters when
    there are any (a LoRA model), else all. The frozen rest has no gradients and no optimiser state."""
    if not any(is_adapter(k) for k in params):
        return params
    return {k: v for k, v in params.items() if is_adapter(k)}


def add_adapters(layers: nnx.Module, cfg, rngs: nnx.Rngs) -> None:
    """Give the stacked decoder layers `layers` (vt.model.qwen2.DecoderLayer) the adapters `cfg` asks for: A
    drawn like PEFT's default (kaiming_uniform with a = sqrt(5): U(+-1/sqrt(fan_in))), B zero."""
    r = cfg.lora_rank
    for name in targets(cfg.lora_targets):
        module_name, n_in = PROJECTIONS[name]
        module = getattr(layers, module_name)
        kernel = getattr(module, f"{name}_kernel")
        shape, axes = kernel.get_value().shape, kernel.get_metadata()["axes"]
        # shape/axes: [L, in..., out...]
        in_shape, out_shape = shape[1:1 + n_in], shape[1 + n_in:]
        bound = 1.0 / math.sqrt(math.prod(in_shape))
        a = jax.random.uniform(rngs.params(), (shape[0], *in_shape, r), jnp.float32, -bound, bound)
        setattr(module, f"{name}_lora_a", nnx.LoRAParam(a, axes=(*axes[:1 + n_in], RANK_AXIS)))
        setattr(module, f"{name}_lora_b", nnx.LoRAParam(jnp.zeros((shape[0], r, *out_shape), jnp.float32),
                                                        axes=(axes[0], RANK_AXIS, *axes[1 + n_in:])))
        module.lora_scale = cfg.lora_alpha / r
        module.lora_dropout = cfg.lora_dropout


# --- dropout: a key for the traced step, folded per layer ---------------------------------------------------------

_dropout = {"key": None, "layer": None}


@contextlib.contextmanager
def dropout_key(key: jax.Array | None) -> Iterator[None]:
    """Trace the model inside this to apply LoRA dropout (training); without it (scoring, sampling, export) there
    is none. The key is folded with the layer index (`layer_scope`) and the projection, so each mask differs."""
    old = _dropout["key"]
    _dropout["key"] = key
    try:
        yield
    finally:
        _dropout["key"] = old


@contextlib.contextmanager
def layer_scope(layer) -> Iterator[None]:
    """The (traced) index of the decoder layer being traced: set by the layer scan."""
    old = _dropout["layer"]
    _dropout["layer"] = layer
    try:
        yield
    finally:
        _dropout["layer"] = old


def _dropped(x, rate: float, name: str):
    key = _dropout["key"]
    if rate == 0.0 or key is None:
        return x
    if _dropout["layer"] is not None:
        key = jax.random.fold_in(key, _dropout["layer"])
    key = jax.random.fold_in(key, list(PROJECTIONS).index(name))
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


# --- the adapted projection ---------------------------------------------------------------------------------------

def project(module: nnx.Module, name: str, equation: str, x):
    """`einsum(equation, x, <name>_kernel)` in x's dtype, plus the adapter's term when `module` has one. The
    kernel's leading operand letters that also appear in x are its input dims (equation "btd,dnh->btnh")."""
    dt = x.dtype
    y = jnp.einsum(equation, x, getattr(module, f"{name}_kernel")[...].astype(dt))
    a = getattr(module, f"{name}_lora_a", None)
    if a is None:
        return y
    lhs, rest = equation.split(",")
    rhs, out = rest.split("->")
    n_in = sum(c in lhs for c in rhs)
    kept = "".join(c for c in lhs if c not in rhs[:n_in])
    h = jnp.einsum(f"{lhs},{rhs[:n_in]}r->{kept}r", _dropped(x, module.lora_dropout, name), a[...].astype(dt))
    delta = jnp.einsum(f"{kept}r,r{rhs[n_in:]}->{out}", h, getattr(module, f"{name}_lora_b")[...].astype(dt))
    return y + delta * jnp.asarray(module.lora_scale, dt)


# --- merging adapters into the kernels ----------------------------------------------------------------------------

def delta_weight(a, b, n_in: int, scale: float, xp=jnp):
    """(alpha / r) * A B of stacked adapters: [L, in..., r] x [L, r, out...] -> [L, in..., out...], in float32."""
    L, r = a.shape[0], a.shape[-1]
    in_shape, out_shape = a.shape[1:1 + n_in], b.shape[2:]
    a2 = xp.reshape(a.astype(np.float32), (L, -1, r))
    b2 = xp.reshape(b.astype(np.float32), (L, r, -1))
    return xp.reshape(xp.matmul(a2, b2), (L, *in_shape, *out_shape)) * np.float32(scale)


def merged_params(params: dict, cfg) -> dict:
    """The flat params of the base architecture (`base_config(cfg)`): each adapted kernel replaced by
    W + (alpha / r) A B computed in float32 and cast to W's dtype, the adapter entries dropped. Works on jax
    and numpy arrays (jit it for device arrays)."""
    if not cfg.lora_rank:
        return dict(params)
    out = {k: v for k, v in params.items() if not is_adapter(k)}
    scale = cfg.lora_alpha / cfg.lora_rank
    for name in targets(cfg.lora_targets):
        module_name, n_in = PROJECTIONS[name]
        prefix = f"layers.{module_name}.{name}"
        w = params[f"{prefix}_kernel"]
        xp = np if isinstance(w, np.ndarray) else jnp
        d = delta_weight(params[f"{prefix}_lora_a"], params[f"{prefix}_lora_b"], n_in, scale, xp)
        out[f"{prefix}_kernel"] = (w.astype(np.float32) + d).astype(w.dtype)
    return out


def base_config(cfg):
    """`cfg` without adapters: the architecture `merged_params` is for."""
    return cfg.replace(lora_rank=0) if cfg.lora_rank else cfg

