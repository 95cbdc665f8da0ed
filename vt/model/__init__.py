"""The Qwen2 family in Flax NNX: config, presets, construction directly into its sharding."""
from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh

from vt.model.config import (ModelConfig, PRESETS, from_hf_config, param_count, preset,  # noqa: F401
                             to_hf_config)
from vt.model.qwen2 import KVCache, Qwen2  # noqa: F401
from vt.sharding import state_shardings


def abstract_model(cfg: ModelConfig) -> Qwen2:
    """The model with ShapeDtypeStructs in place of arrays: costs no memory."""
    return nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0)))


def model_shardings(cfg: ModelConfig, mesh: Mesh):
    return state_shardings(nnx.state(abstract_model(cfg)), mesh)


def init_fn(cfg: ModelConfig, mesh: Mesh | None = None, seed: int = 0):
    """The jitted random init of the parameter state, each parameter created in its sharding on `mesh`
    (out_shardings). The stacked decoder weights are drawn by one op per weight kind, so this compiles in the
    same time at any depth."""
    def init_state():
        return nnx.state(Qwen2(cfg, rngs=nnx.Rngs(seed)))

    if mesh is None:
        return jax.jit(init_state)
    return jax.jit(init_state, out_shardings=state_shardings(nnx.state(abstract_model(cfg)), mesh))


def create_model(cfg: ModelConfig, mesh: Mesh | None = None, seed: int = 0) -> Qwen2:
    """Random-init model. With a mesh, each parameter is initialised already sharded (jit with out_shardings),
    so no device or host ever holds the whole model."""
    graphdef, _ = nnx.split(abstract_model(cfg))
    return nnx.merge(graphdef, init_fn(cfg, mesh, seed)())
