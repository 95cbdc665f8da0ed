"""The jitted pure train and eval steps, and the update tail both learners share.

    train_step(state, batch) -> (state, metrics)    compiled once (AOT) with explicit shardings, state donated

`batch` holds int32/float32 arrays shaped [A, b, T] (A micro-batches of b packed rows; A = 1 without gradient
accumulation): input_ids, targets, loss_mask, segment_ids, positions (vt.data.packing). Gradients of the
micro-batches are summed in fp32 under `lax.scan` (`accumulate_gradients`; one micro-batch is a plain
gradient, no loop); each micro-batch's loss is divided
by the token count of the whole step, so the result is the per-token mean over the global batch
(vt.train.losses).

Shared with the RL step (vt.rl.step), so both learners update the same way:
  - `accumulate_gradients(loss_fn, params, acc, micro_batch)`: one micro-batch's gradients and metric sums
    added to the running fp32 sums (acc None, or `zero_accumulator`, starts them);
  - `apply_update(optimizer, schedule, state, grads, loss)`: the optimiser update, skipped on device when the
    loss or the gradient norm is not finite.
Gradients, their sums and the optimiser state cover the trainable parameters only (vt.model.lora.trainable:
all of them, or a LoRA model's adapters); the frozen base weights pass through an update untouched.
A skipped update reports `finite = 0`; the host halts the run when it sees that, so no bad state can ever be
checkpointed. Every step is a vt.distributed.MeshProgram: compiled ahead of time with in/out shardings, the state
donated.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt.distributed import MeshProgram
from vt.model import lora
from vt.sharding import logical_to_spec
from vt.train.losses import DEFAULT_LOSS_CHUNK, masked_nll_sum
from vt.train.state import ModelDef, TrainState

BATCH_KEYS = ("input_ids", "targets", "loss_mask", "segment_ids", "positions")
BATCH_DTYPES = {k: np.float32 if k == "loss_mask" else np.int32 for k in BATCH_KEYS}


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[A, b, T]: the micro-batch axis stays whole on every device, rows split over data x fsdp."""
    return NamedSharding(mesh, logical_to_spec((None, "batch", "sequence")))


def as_microbatches(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Keep the model's keys; [B, T] -> [1, B, T]; fixed dtypes (so the compiled step never retraces). The rows
    (axis 1) are this process's share: vt.distributed.global_batch(..., row_axis=1) places them."""
    out = {}
    for k in BATCH_KEYS:
        v = np.asarray(batch[k])
        out[k] = (v[None] if v.ndim == 2 else v).astype(BATCH_DTYPES[k], copy=False)
    return out


# --- the update tail both learners share --------------------------------------------------------------------------

def zero_accumulator(params, metric_keys: Sequence[str] = ()) -> dict:
    """fp32 zeros for the summed gradients, the summed loss and each summed metric in `metric_keys`."""
    return {"grads": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), lora.trainable(params)),
            "loss": jnp.zeros((), jnp.float32), **{k: jnp.zeros((), jnp.float32) for k in metric_keys}}


def accumulate_gradients(loss_fn: Callable, params, acc: dict | None, micro_batch) -> dict:
    """`acc` plus one micro-batch's gradients, loss and metrics (fp32 sums); `acc` None: this micro-batch's
    start the sums (nothing to zero and add to). `loss_fn(params, micro_batch)` returns (loss, {metric: value})
    with every metric key of `acc`, each already that micro-batch's share. Gradients of the trainable
    parameters only (vt.model.lora.trainable)."""
    train = lora.trainable(params)
    frozen = {k: v for k, v in params.items() if k not in train}
    (loss, metrics), grads = jax.value_and_grad(lambda t, mb: loss_fn(frozen | t, mb), has_aux=True)(train, micro_batch)
    new = {"grads": grads, "loss": loss, **metrics}
    if acc is None:
        return jax.tree.map(lambda x: x.astype(jnp.float32), new)
    return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, new)


def apply_update(optimizer: optax.GradientTransformation, schedule: optax.Schedule, state: TrainState, grads,
                 loss: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update of `state` by `grads`; a non-finite loss or gradient norm leaves `state` as it was.
    Returns the new state and {loss, grad_norm, lr (of this update), finite}."""
    grad_norm = optax.tree.norm(grads)  # optax.global_norm is deprecated
    train = lora.trainable(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, train)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new = TrainState(step=state.step + 1, params=state.params | optax.apply_updates(train, updates),
                     opt_state=opt_state)
    # A non-finite update is not applied; the host halts the run on `finite = 0` before any save.
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
    return new, {"loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step), "finite": finite}


# --- SFT -------------------------------------------------------------------------------------------------------------

def _micro_nll_sum(model_def: ModelDef, params, mb, loss_chunk: int):
    """(sum of masked NLL, number of loss tokens) of one micro-batch, log-probs in sequence chunks."""
    logp = model_def.token_logps(params, mb["input_ids"], mb["positions"], mb["segment_ids"], mb["targets"],
                                 chunk=loss_chunk)
    return masked_nll_sum(logp, mb["loss_mask"])


def _loss_and_grads(model_def: ModelDef, params, batch, param_sh, loss_chunk: int = DEFAULT_LOSS_CHUNK,
                    dropout_key=None):
    """(per-token mean loss over the whole batch, its gradients, number of loss tokens) of an [A, b, T] batch.
    `dropout_key`: the step's LoRA dropout key (None: no dropout), folded with the micro-batch index."""
    num_tokens = jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)

    def micro_loss(p, mb):
        i, mb = mb
        with lora.dropout_key(None if dropout_key is None else jax.random.fold_in(dropout_key, i)):
            total, _ = _micro_nll_sum(model_def, p, mb, loss_chunk)
        return total / num_tokens, {}

    def body(acc, mb):
        acc = accumulate_gradients(micro_loss, params, acc, mb)
        return acc | {"grads": jax.lax.with_sharding_constraint(acc["grads"], lora.trainable(param_sh))}, None

    if batch["input_ids"].shape[0] == 1:
        # No accumulation (as at small shapes): a plain gradient, no one-trip loop or zeroed sums around it. With
        # several micro-batches the body is traced once, inside the scan (peeling the first would compile the
        # forward and backward twice).
        acc, _ = body(None, (jnp.int32(0), jax.tree.map(lambda x: x[0], batch)))
        return acc["loss"], acc["grads"], num_tokens
    zeros = zero_accumulator(params)
    zeros["grads"] = jax.lax.with_sharding_constraint(zeros["grads"], lora.trainable(param_sh))
    micro_batches = batch["input_ids"].shape[0]
    acc, _ = jax.lax.scan(body, zeros, (jnp.arange(micro_batches), batch))
    return acc["loss"], acc["grads"], num_tokens


def make_train_step(model_def: ModelDef, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                    state_sh: TrainState, abstract_state: TrainState, mesh: Mesh,
                    micro_batches: int, micro_batch_size: int, seq_len: int,
                    loss_chunk: int = DEFAULT_LOSS_CHUNK) -> Callable:
    """Compile the train step for one batch shape, once, ahead of time; returns the executable, called as
    `step(state, batch)` with `batch` from vt.distributed.global_batch. A batch of another shape or sharding is
    an error, never a silent retrace. `loss_chunk`: sequence positions per chunk of the loss
    (vt.train.losses.token_logps)."""
    program, abstract_batch = train_step_program(model_def, optimizer, schedule, state_sh, mesh, micro_batches,
                                                 micro_batch_size, seq_len, loss_chunk)
    return program.compile(abstract_state, abstract_batch)


def train_step_program(model_def: ModelDef, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                       state_sh: TrainState, mesh: Mesh, micro_batches: int, micro_batch_size: int, seq_len: int,
                       loss_chunk: int = DEFAULT_LOSS_CHUNK) -> tuple[MeshProgram, dict]:
    """make_train_step's program, not yet compiled, and its abstract batch (`vt plan` lowers it to tell which
    stages share one program before compiling any)."""
    b_sh = batch_sharding(mesh)

    def train_step(state: TrainState, batch) -> tuple[TrainState, dict]:
        # LoRA dropout (model.lora_dropout > 0): a fresh mask every update, the same on a resumed run.
        key = jax.random.fold_in(jax.random.key(0), state.step) if model_def.cfg.lora_dropout else None
        loss, grads, num_tokens = _loss_and_grads(model_def, state.params, batch, state_sh.params, loss_chunk, key)
        new, metrics = apply_update(optimizer, schedule, state, grads, loss)
        return new, metrics | {"loss_tokens": num_tokens, "tokens": jnp.sum(batch["segment_ids"] > 0)}

    shape = (micro_batches, micro_batch_size, seq_len)
    abstract_batch = {k: jax.ShapeDtypeStruct(shape, BATCH_DTYPES[k], sharding=b_sh) for k in BATCH_KEYS}
    program = MeshProgram(train_step, mesh, in_shardings=(state_sh, b_sh),
                          out_shardings=(state_sh, NamedSharding(mesh, P())), donate_argnums=(0,))
    return program, abstract_batch


def make_eval_step(model_def: ModelDef, param_sh, mesh: Mesh, loss_chunk: int = DEFAULT_LOSS_CHUNK) -> MeshProgram:
    """eval_step(params, batch) -> (sum of masked NLL, number of loss tokens); compiled once per batch shape."""
    def eval_step(params, batch):
        def body(carry, mb):
            total, count = _micro_nll_sum(model_def, params, mb, loss_chunk)
            return (carry[0] + total, carry[1] + count), None
        (total, count), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(())), batch)
        return total, count

    return MeshProgram(eval_step, mesh, in_shardings=(param_sh, batch_sharding(mesh)),
                       out_shardings=NamedSharding(mesh, P()))
