"""The jitted pure train and eval steps.

    train_step(state, batch) -> (state, metrics)    compiled once (AOT) with explicit shardings, state donated

`batch` holds int32/float32 arrays shaped [A, b, T] (A micro-batches of b packed rows; A = 1 without gradient
accumulation): input_ids, targets, loss_mask, segment_ids, positions (vt.data.packing). Gradients of the
micro-batches are summed in fp32 under `lax.scan`; each micro-batch's loss is divided by the token count of
the whole step, so the result is the per-token mean over the global batch (vt.train.losses).

A non-finite loss or gradient norm leaves the state untouched (the update is skipped on device) and reports
`finite = 0`; the host halts the run when it sees that, so no bad state can ever be checkpointed.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt.sharding import logical_to_spec, use_mesh
from vt.train.losses import DEFAULT_LOSS_CHUNK, masked_nll_sum
from vt.train.state import ModelDef, TrainState

BATCH_KEYS = ("input_ids", "targets", "loss_mask", "segment_ids", "positions")
_DTYPES = {"loss_mask": np.float32}


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[A, b, T]: the micro-batch axis stays whole on every device, rows split over data x fsdp."""
    return NamedSharding(mesh, logical_to_spec((None, "batch", "sequence")))


def as_microbatches(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Keep the model's keys; [B, T] -> [1, B, T]; fixed dtypes (so the compiled step never retraces)."""
    out = {}
    for k in BATCH_KEYS:
        v = np.asarray(batch[k])
        out[k] = (v[None] if v.ndim == 2 else v).astype(_DTYPES.get(k, np.int32), copy=False)
    return out


def device_batch(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Place this process's rows of the global batch (multi-host: each process passes only its share)."""
    def put(x):
        global_shape = (x.shape[0], x.shape[1] * jax.process_count(), x.shape[2])
        return jax.make_array_from_process_local_data(sharding, x, global_shape)
    return {k: put(v) for k, v in as_microbatches(batch).items()}


def _micro_nll_sum(model_def: ModelDef, params, mb, loss_chunk: int):
    """(sum of masked NLL, number of loss tokens) of one micro-batch, log-probs in sequence chunks."""
    logp = model_def.token_logps(params, mb["input_ids"], mb["positions"], mb["segment_ids"], mb["targets"],
                                 chunk=loss_chunk)
    return masked_nll_sum(logp, mb["loss_mask"])


def _loss_and_grads(model_def: ModelDef, params, batch, param_sh, loss_chunk: int = DEFAULT_LOSS_CHUNK):
    num_tokens = jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)

    def micro_loss(p, mb):
        total, _ = _micro_nll_sum(model_def, p, mb, loss_chunk)
        return total / num_tokens

    def body(carry, mb):
        grads_acc, loss_acc = carry
        loss, grads = jax.value_and_grad(micro_loss)(params, mb)
        grads_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_acc, grads)
        return (jax.lax.with_sharding_constraint(grads_acc, param_sh), loss_acc + loss), None

    zeros = jax.lax.with_sharding_constraint(
        jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), param_sh)
    (grads, loss), _ = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), batch)
    return loss, grads, num_tokens


def make_train_step(model_def: ModelDef, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                    state_sh: TrainState, abstract_state: TrainState, mesh: Mesh,
                    micro_batches: int, micro_batch_size: int, seq_len: int,
                    loss_chunk: int = DEFAULT_LOSS_CHUNK) -> Callable:
    """Compile the train step for one batch shape, once, ahead of time; returns the executable, called as
    `step(state, device_batch)`. A batch of another shape or sharding is an error, never a silent retrace.
    `loss_chunk`: sequence positions per chunk of the loss (vt.train.losses.token_logps)."""
    b_sh = batch_sharding(mesh)

    def train_step(state: TrainState, batch) -> tuple[TrainState, dict]:
        loss, grads, num_tokens = _loss_and_grads(model_def, state.params, batch, state_sh.params, loss_chunk)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         rng=jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0]))
        new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
        metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step),
                   "loss_tokens": num_tokens, "tokens": jnp.sum(batch["segment_ids"] > 0),
                   "finite": finite, "step": state.step}
        return new, metrics

    shape = (micro_batches, micro_batch_size, seq_len)
    abstract_batch = {k: jax.ShapeDtypeStruct(shape, _DTYPES.get(k, np.int32), sharding=b_sh) for k in BATCH_KEYS}
    jitted = jax.jit(train_step, in_shardings=(state_sh, b_sh), out_shardings=(state_sh, NamedSharding(mesh, P())),
                     donate_argnums=(0,))
    with use_mesh(mesh):
        return jitted.lower(abstract_state, abstract_batch).compile()


def make_eval_step(model_def: ModelDef, param_sh, mesh: Mesh, loss_chunk: int = DEFAULT_LOSS_CHUNK) -> Callable:
    """eval_step(params, batch) -> (sum of masked NLL, number of loss tokens); jitted (retraces per shape)."""
    def eval_step(params, batch):
        def body(carry, mb):
            total, count = _micro_nll_sum(model_def, params, mb, loss_chunk)
            return (carry[0] + total, carry[1] + count), None
        (total, count), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(())), batch)
        return total, count

    jitted = jax.jit(eval_step, in_shardings=(param_sh, batch_sharding(mesh)),
                     out_shardings=NamedSharding(mesh, P()))

    def run(params, batch):
        with use_mesh(mesh):
            return jitted(params, batch)
    return run

