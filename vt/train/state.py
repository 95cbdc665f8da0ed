"""The learner's state as one pytree, and its shardings.

Parameters are a flat dict "layers.attn.q_kernel" -> array (decoder weights stacked [num_layers, ...]): the
same keys and layout as the `params` item of a model checkpoint (vt.checkpoint.params), so a train-state
checkpoint is a model checkpoint too. The model's graph (nnx GraphDef) is static and lives in :class:`ModelDef`, outside the state.
Optimiser moments are sharded exactly like the parameter they belong to; scalars (counts) are replicated.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt.checkpoint.params import path_key
from vt.model.lora import trainable
from vt.model.qwen2 import abstract_model
from vt.model.config import ModelConfig
from vt.sharding import state_shardings
from vt.train.losses import DEFAULT_LOSS_CHUNK, token_logps


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    step: jax.Array  # int32 []: optimiser updates applied so far (an RL step applies mgpo.mini_batches of them)
    params: dict[str, jax.Array]
    opt_state: Any


class ModelDef:
    """The static half of the model: call `apply(params, ...)` inside jit to run the forward pass."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.graphdef, self.abstract_state = nnx.split(abstract_model(cfg))

    def bind(self, params: dict[str, jax.Array]):
        state = nnx.map_state(lambda path, var: var.replace(params[path_key(path)]), self.abstract_state)
        return nnx.merge(self.graphdef, state)

    def apply(self, params, tokens_BT, positions_BT, segment_ids_BT) -> jax.Array:
        logits_BTV, _ = self.bind(params)(tokens_BT, positions_BT, segment_ids_BT)
        return logits_BTV

    def apply_hidden(self, params, tokens_BT, positions_BT, segment_ids_BT) -> tuple[jax.Array, jax.Array]:
        """(final-normed hidden states [B, T, D], LM head [D, padded V]): for losses computed in chunks."""
        model = self.bind(params)
        x_BTD, _ = model.hidden_states(tokens_BT, positions_BT, segment_ids_BT)
        return x_BTD, model.head_DV()

    def token_logps(self, params, tokens_BT, positions_BT, segment_ids_BT, targets_BT, *, temperature: float = 1.0,
                    chunk: int = DEFAULT_LOSS_CHUNK, with_entropy: bool = False):
        """log pi(target) per position [B, T] (and the entropy with `with_entropy`), computed from the hidden
        states in sequence chunks: no float32 [B, T, V] logits (vt.train.losses.token_logps)."""
        x_BTD, head_DV = self.apply_hidden(params, tokens_BT, positions_BT, segment_ids_BT)
        return token_logps(x_BTD, head_DV, targets_BT, vocab_size=self.cfg.vocab_size, dtype=self.cfg.dtype,
                           temperature=temperature, chunk=chunk, with_entropy=with_entropy)

    def abstract_params(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {path_key(p): jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype)
                for p, v in nnx.to_flat_state(self.abstract_state)}

    def param_shardings(self, mesh: Mesh) -> dict[str, NamedSharding]:
        return {path_key(p): v for p, v in nnx.to_flat_state(state_shardings(self.abstract_state, mesh))}


def _replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def opt_state_shardings(abstract_opt_state, param_shardings: dict[str, NamedSharding], abstract_params, mesh: Mesh):
    """Moments (leaves under a dict key naming a parameter, with its shape) follow that parameter's sharding."""
    def one(path, leaf):
        last = path[-1] if path else None
        key = getattr(last, "key", None)
        if isinstance(key, str) and key in param_shardings and abstract_params[key].shape == leaf.shape:
            return param_shardings[key]
        return _replicated(mesh)
    return jax.tree_util.tree_map_with_path(one, abstract_opt_state)


def _init_fn(optimizer: optax.GradientTransformation):
    def init(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(trainable(params)))
    return init


def train_state_shardings(model_def: ModelDef, optimizer, mesh: Mesh) -> TrainState:
    abstract = jax.eval_shape(_init_fn(optimizer), model_def.abstract_params())
    p_sh = model_def.param_shardings(mesh)
    return TrainState(step=_replicated(mesh), params=p_sh,
                      opt_state=opt_state_shardings(abstract.opt_state, p_sh, abstract.params, mesh))


def abstract_train_state(model_def: ModelDef, optimizer, shardings: TrainState) -> TrainState:
    """ShapeDtypeStructs with shardings: the restore target of a checkpoint."""
    abstract = jax.eval_shape(_init_fn(optimizer), model_def.abstract_params())
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def init_train_state(params: dict[str, jax.Array], optimizer, shardings: TrainState) -> TrainState:
    """Fresh optimiser state around `params` (the trainable ones: vt.model.lora.trainable), created directly in its sharding."""
    return jax.jit(_init_fn(optimizer), in_shardings=(shardings.params,), out_shardings=shardings)(params)
