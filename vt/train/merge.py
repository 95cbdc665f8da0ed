"""Parameter-level checkpoint merging (model soup / the uniform average of Diversity-Exploring Distillation).

    merged[k] = sum_i w_i * params_i[k],   w_i >= 0, sum_i w_i = 1   (uniform: w_i = 1 / n)

Accumulated in float32 whatever the stored dtype, written in the first checkpoint's `param_dtype`. LoRA
checkpoints are merged as the models they compute (adapters folded into the weights first): the result is a
plain model. Only one
input checkpoint is in memory at a time besides the running sum.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vt import VtError
from vt.checkpoint.io import atomic_output_dir
from vt.checkpoint.params import flat_params, load_model, load_model_config, merge_adapters, write_model_entries
from vt.model.lora import base_config

# Fields that must agree between merged checkpoints (dtypes, attention and remat settings may differ).
_ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "tie_word_embeddings", "vocab_pad_multiple", "rope_theta", "rms_norm_eps")


def normalize_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if n == 0:
        raise VtError("merge: no checkpoints given")
    if weights is None:
        return [1.0 / n] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise VtError(f"merge: {len(w)} weights for {n} checkpoints")
    if any(not np.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
        raise VtError(f"merge: weights must be finite, non-negative and not all zero, got {w}")
    return [x / sum(w) for x in w]


def merge_params(params: Sequence[Mapping[str, jax.Array]], weights: Sequence[float] | None = None) -> dict:
    """Weighted average of flat parameter dicts with identical keys and shapes (pure; for tests and in-memory use)."""
    w = normalize_weights(weights, len(params))
    acc = None
    for i, (p, wi) in enumerate(zip(params, w)):
        acc = _accumulate(acc, p, wi, f"params[{i}]")
    return {k: v.astype(params[0][k].dtype) for k, v in acc.items()}


def _accumulate(acc, p, w, where):
    if acc is not None and set(p) != set(acc):
        raise VtError(f"merge: {where} has different parameters (e.g. {sorted(set(p) ^ set(acc))[:3]})")
    out = {}
    for k, v in p.items():
        term = jnp.asarray(v, jnp.float32) * w
        if acc is not None:
            if acc[k].shape != v.shape:
                raise VtError(f"merge: {where}: parameter {k} has shape {v.shape}, expected {acc[k].shape}")
            term = acc[k] + term
        out[k] = term
    return out


def merge_checkpoints(ckpt_dirs: Sequence[Path | str], out_dir: Path | str,
                      weights: Sequence[float] | None = None) -> list[float]:
    """Write the weighted average of `ckpt_dirs` (vt model checkpoints or learner step dirs) to `out_dir`."""
    w = normalize_weights(weights, len(ckpt_dirs))
    cfgs = [load_model_config(d) for d in ckpt_dirs]
    for d, c in zip(ckpt_dirs[1:], cfgs[1:]):
        diff = [f for f in _ARCH_FIELDS if getattr(c, f) != getattr(cfgs[0], f)]
        if diff:
            raise VtError(f"merge: {d} has a different architecture from {ckpt_dirs[0]} (fields {diff})")
    acc, dtypes = None, None
    for d, wi in zip(ckpt_dirs, w):
        params = flat_params(merge_adapters(load_model(d)))  # a LoRA run's step: its adapters folded in
        dtypes = dtypes or {k: v.dtype for k, v in params.items()}
        acc = _accumulate(acc, params, wi, str(d))
        del params
    merged = {k: v.astype(dtypes[k]) for k, v in acc.items()}
    with atomic_output_dir(out_dir) as tmp:
        write_model_entries(tmp, base_config(cfgs[0]), merged)
    return w
