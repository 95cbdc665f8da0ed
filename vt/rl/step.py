"""The jitted pure functions of the RL learner.

    token_logps(params, micro_batch) -> logp [b, T]        log pi(target) at every slot (no gradient)
    rl_step(state, micro_batches) -> (state, metrics)      one optimiser update on the MGPO objective, donated

Shape letters: b rows of a micro-batch, T row length (slots); a row holds one or more samples.

A micro-batch is b token rows of length T (vt.rl.rollouts.build_rows: packed rows hold several samples, told
apart by segment ids, positions restarting per sample), with `loss_mask` on completion targets, per-token `adv`
(w(q) * A_i of the slot's sample), per-token `weight` (the token's share of J: objectives.objective_weights,
0 off completion targets), sampler_logp, ref_logp when a KL term is used, and old_logp (pi_old: the learner
before this batch's first update). With one update per batch pi_old is the current policy, so old_logp may
be left out: the step then takes it as stop_gradient(logp), saving a forward pass. The truncated importance
weight min(pi_old / pi_sampler, C) is a constant computed from old_logp and sampler_logp.

One update = the gradients of its micro-batches summed (gradient accumulation, the SFT step's
vt.train.step.accumulate_gradients) and applied by the SFT step's vt.train.step.apply_update: J and the KL term
are sums of weight * per-token value, so the sum over micro-batches (and over processes' rows) is the
mini-batch's per-sequence or per-token mean, whatever the layout. Each micro-batch is one call of a program
compiled ahead of time once per [b, T] (vt.distributed.MeshProgram; the learner keeps b * T at its token
budget): a step may have any number of micro-batches without compiling again. An update of a single
micro-batch (the common case at small shapes) runs as one program (zeros, accumulate and apply fused).
Logits are divided by the sampling temperature before the softmax, so pi is the distribution that was sampled;
log-probs are computed from the hidden states in sequence chunks of `loss_chunk` positions.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt.distributed import MeshProgram
from vt.model.lora import trainable
from vt.rl.objectives import kl_to_reference, surrogate_per_token, truncated_importance_weight
from vt.sharding import logical_to_spec
from vt.train.losses import DEFAULT_LOSS_CHUNK
from vt.train.state import ModelDef, TrainState
from vt.train.step import accumulate_gradients, apply_update, zero_accumulator

# What the host sends per micro-batch; the learner adds old_logp and ref_logp (token_logps) on device.
ROW_KEYS = ("input_ids", "targets", "positions", "segment_ids", "loss_mask", "adv", "weight", "sampler_logp")
# Token means of the metrics: summed over micro-batches as sum(loss_mask * x), divided by its sum at the end.
TOKEN_MEAN_METRICS = ("clip_fraction", "ratio_mean", "is_weight_mean", "is_weight_capped", "mismatch_kl", "entropy")


def row_sharding(mesh: Mesh) -> NamedSharding:
    """[b, T] rows of a micro-batch: split over data x fsdp (every key of a micro-batch is sharded alike)."""
    return NamedSharding(mesh, logical_to_spec(("batch", "sequence")))


def _logps(md: ModelDef, params, batch, temperature: float, loss_chunk: int, with_entropy: bool = False):
    # In sequence chunks from the hidden states: no float32 [b, T, V] logits (vt.train.losses.token_logps).
    return md.token_logps(params, batch["input_ids"], batch["positions"], batch["segment_ids"], batch["targets"],
                          temperature=temperature, chunk=loss_chunk, with_entropy=with_entropy)


def make_token_logps(md: ModelDef, param_sh, mesh: Mesh, temperature: float,
                     loss_chunk: int = DEFAULT_LOSS_CHUNK) -> MeshProgram:
    """token_logps(params, micro_batch) -> log pi(target) [b, T]: pi_old and the KL reference."""
    def token_logps(params, batch):
        return _logps(md, params, batch, temperature, loss_chunk)
    return MeshProgram(token_logps, mesh, in_shardings=(param_sh, row_sharding(mesh)),
                       out_shardings=row_sharding(mesh))


def make_rl_step(md: ModelDef, optimizer: optax.GradientTransformation, schedule, state_sh: TrainState, mesh: Mesh,
                 *, temperature: float, eps_low: float, eps_high: float, kl_coef: float, is_cap: float,
                 loss_chunk: int = DEFAULT_LOSS_CHUNK):
    def loss_fn(params, batch):
        """This micro-batch's share of the loss (-J + kl_coef * KL) and its metric sums."""
        # Entropy of pi at completion positions: a collapse to 0 is the classic RL failure to watch for.
        logp, ent = _logps(md, params, batch, temperature, loss_chunk, with_entropy=True)
        old = batch["old_logp"] if "old_logp" in batch else jax.lax.stop_gradient(logp)
        is_weight = truncated_importance_weight(old, batch["sampler_logp"], is_cap)
        per_token, ratio, clipped = surrogate_per_token(logp, old, batch["adv"], eps_low=eps_low,
                                                        eps_high=eps_high, is_weight=is_weight)
        weight, mask = batch["weight"], batch["loss_mask"]
        J = jnp.sum(per_token * weight)
        loss = -J
        m = {"objective": J}
        if kl_coef:
            kl = jnp.sum(kl_to_reference(logp, batch["ref_logp"]) * weight)
            loss, m["kl_ref"] = loss + kl_coef * kl, kl
        per_token_metrics = {"clip_fraction": clipped, "ratio_mean": ratio, "is_weight_mean": is_weight,
                             "is_weight_capped": is_weight >= is_cap,
                             "mismatch_kl": kl_to_reference(batch["sampler_logp"], old), "entropy": ent}
        m |= {k: jnp.sum(jax.lax.stop_gradient(v).astype(jnp.float32) * mask) for k, v in per_token_metrics.items()}
        m["completion_tokens"] = jnp.sum(mask)
        return loss, m

    metric_keys = ["objective", *(["kl_ref"] if kl_coef else []), *TOKEN_MEAN_METRICS, "completion_tokens"]

    def zeros(params):
        return zero_accumulator(params, metric_keys)

    def accumulate(params, acc, batch):
        return accumulate_gradients(loss_fn, params, acc, batch)

    def apply(state: TrainState, acc):
        new, out = apply_update(optimizer, schedule, state, acc["grads"], acc["loss"])
        m = {k: acc[k] for k in metric_keys if k != "completion_tokens"}
        for k in TOKEN_MEAN_METRICS:
            m[k] = m[k] / jnp.maximum(acc["completion_tokens"], 1.0)
        return new, m | out

    replicated = NamedSharding(mesh, P())
    acc_sh = {"grads": trainable(state_sh.params), "loss": replicated, **{k: replicated for k in metric_keys}}
    zeros_prog = MeshProgram(zeros, mesh, in_shardings=(state_sh.params,), out_shardings=acc_sh)
    accumulate_prog = MeshProgram(accumulate, mesh, in_shardings=(state_sh.params, acc_sh, row_sharding(mesh)),
                                  out_shardings=acc_sh, donate_argnums=(1,))
    apply_prog = MeshProgram(apply, mesh, in_shardings=(state_sh, acc_sh), out_shardings=(state_sh, replicated),
                             donate_argnums=(0,))

    def update_one(state: TrainState, batch):
        return apply(state, accumulate(state.params, None, batch))

    # A mini-batch of one micro-batch (every step at small shapes) runs as one program: one dispatch instead of
    # three, and no fp32 gradient accumulator written out and read back between them.
    update_one_prog = MeshProgram(update_one, mesh, in_shardings=(state_sh, row_sharding(mesh)),
                                  out_shardings=(state_sh, replicated), donate_argnums=(0,))
    return RLStep(zeros_prog, accumulate_prog, apply_prog, update_one_prog)


@dataclasses.dataclass(frozen=True)
class RLStep:
    """One RL update (`make_rl_step`): `step(state, micro_batches) -> (state, metrics)` on the summed gradients
    of `micro_batches` (dicts of [b, T] arrays), through its compiled programs."""
    zeros: MeshProgram  # params -> an empty accumulator
    accumulate: MeshProgram  # (params, accumulator, micro-batch) -> accumulator
    apply: MeshProgram  # (state, accumulator) -> (state, metrics)
    update_one: MeshProgram  # (state, micro-batch) -> (state, metrics): one micro-batch in one program

    def __call__(self, state: TrainState, micro_batches):
        if len(micro_batches) == 1:
            return self.update_one(state, micro_batches[0])
        return self.apply(state, self._accumulated(state.params, micro_batches))

    def _accumulated(self, params, micro_batches):
        if not micro_batches:
            raise ValueError("rl_step needs at least one micro-batch")
        acc = self.zeros(params)
        for mb in micro_batches:  # each shape [b, T] compiles once
            acc = self.accumulate(params, acc, mb)
        return acc

    def gradients(self, params, micro_batches):
        """(summed gradients, summed loss) of `micro_batches`, nothing updated (tests)."""
        acc = self._accumulated(params, micro_batches)
        return acc["grads"], acc["loss"]

    @property
    def programs(self) -> dict[str, MeshProgram]:  # bench/compile.py
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
