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


def create_model(cfg: ModelConfig, mesh: Mesh | None = None, seed: int = 0) -> Qwen2:
    """Random-init model. With a mesh, each parameter is initialised already sharded (jit with out_shardings),
    so no device or host ever holds the whole model."""
    graphdef, abstract_state = nnx.split(abstract_model(cfg))

    def init_state():
        return nnx.state(Qwen2(cfg, rngs=nnx.Rngs(seed)))

    if mesh is None:
        state = jax.jit(init_state)()
    else:
        state = jax.jit(init_state, out_shardings=state_shardings(abstract_state, mesh))()
    return nnx.merge(graphdef, state)
