"""The jitted pure functions of the RL learner.

    token_logps(params, micro_batch) -> logp [b, T]        log pi(target) at every slot (no gradient)
    rl_step(state, micro_batches) -> (state, metrics)      one optimiser update on the MGPO objective, donated

A micro-batch is b token rows of length T (vt.rl.rollouts.build_rows: packed rows hold several samples, told
apart by segment ids, positions restarting per sample), with `mask` on completion targets, per-token `adv`
(w(q) * A_i of the slot's sample), per-token `weight` (the token's share of J: objectives.objective_weights,
0 off completion targets), sampler_logp, ref_logp when a KL term is used, and old_logp (pi_old: the learner
before this batch's first update). With one update per batch pi_old is the current policy, so old_logp may
be left out: the step then takes it as stop_gradient(logp), saving a forward pass. The truncated importance
weight min(pi_old / pi_sampler, C) is a constant computed from old_logp and sampler_logp.

One update = the gradients of its micro-batches summed (gradient accumulation): J and the KL term are sums
of weight * per-token value, so the sum over micro-batches (and over processes' rows) is the mini-batch's
per-sequence or per-token mean, whatever the layout. Each micro-batch is one call of a function compiled
once per [b, T] (the learner keeps b * T at its token budget): a step may have any number of micro-batches
without compiling again.
Logits are divided by the sampling temperature before the softmax, so pi is the distribution that was sampled;
log-probs are computed from the hidden states in sequence chunks of `loss_chunk` positions.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt.rl.objectives import kl_to_reference, surrogate_per_token, truncated_importance_weight
from vt.sharding import logical_to_spec, use_mesh
from vt.train.losses import DEFAULT_LOSS_CHUNK
from vt.train.state import ModelDef, TrainState

# What the host sends per micro-batch; the learner adds old_logp and ref_logp (token_logps) on device.
ROW_KEYS = ("tokens", "targets", "positions", "segment_ids", "mask", "adv", "weight", "sampler_logp")
# Token means of the metrics: summed over micro-batches as sum(mask * x), divided by the mask's sum at the end.
TOKEN_MEAN_METRICS = ("clip_fraction", "ratio_mean", "is_weight_mean", "is_weight_capped", "mismatch_kl", "entropy")


def batch_shardings(mesh: Mesh, keys) -> dict[str, NamedSharding]:
    rows = NamedSharding(mesh, logical_to_spec(("batch", "sequence")))
    return {k: rows for k in keys}


def _logps(md: ModelDef, params, batch, temperature: float, loss_chunk: int, with_entropy: bool = False):
    # In sequence chunks from the hidden states: no float32 [N, T, V] logits (vt.train.losses.token_logps).
    return md.token_logps(params, batch["tokens"], batch["positions"], batch["segment_ids"], batch["targets"],
                          temperature=temperature, chunk=loss_chunk, with_entropy=with_entropy)


def make_token_logps(md: ModelDef, mesh: Mesh, temperature: float, loss_chunk: int = DEFAULT_LOSS_CHUNK):
    @jax.jit
    def token_logps(params, batch):
        return _logps(md, params, batch, temperature, loss_chunk)

    def run(params, batch):
        with use_mesh(mesh):
            return token_logps(params, batch)
    run.jitted = token_logps
    return run


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
        weight, mask = batch["weight"], batch["mask"]
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

    def accumulate(params, acc, batch):
        (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        new = {"grads": grads, "loss": loss, **m}
        return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, new)

    scalar_keys = ["loss", "objective", *(["kl_ref"] if kl_coef else []), *TOKEN_MEAN_METRICS, "completion_tokens"]

    def zeros(params):
        return {"grads": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
                **{k: jnp.zeros((), jnp.float32) for k in scalar_keys}}

    def apply(state: TrainState, acc):
        grads, loss = acc["grads"], acc["loss"]
        grad_norm = optax.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state, rng=state.rng)
        # A non-finite update is not applied; the host halts the run on `finite = 0` before any save.
        new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
        m = {k: v for k, v in acc.items() if k not in ("grads", "completion_tokens")}
        for k in TOKEN_MEAN_METRICS:
            m[k] = m[k] / jnp.maximum(acc["completion_tokens"], 1.0)
        return new, {**m, "loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step), "finite": finite}

    replicated = NamedSharding(mesh, P())
    acc_sh = {"grads": state_sh.params, **{k: replicated for k in scalar_keys}}
    zeros_jit = jax.jit(zeros, out_shardings=acc_sh)
    accumulate_jit = jax.jit(accumulate, out_shardings=acc_sh, donate_argnums=(1,))
    apply_jit = jax.jit(apply, out_shardings=(state_sh, replicated), donate_argnums=(0,))

    def accumulated(params, micro_batches):
        if not micro_batches:
            raise ValueError("rl_step needs at least one micro-batch")
        with use_mesh(mesh):
            acc = zeros_jit(params)
            for mb in micro_batches:  # each shape [b, T] compiles once
                acc = accumulate_jit(params, acc, mb)
        return acc

    def run(state: TrainState, micro_batches):
        """One update on the summed gradients of `micro_batches` (dicts of [b, T] arrays)."""
        acc = accumulated(state.params, micro_batches)
        with use_mesh(mesh):
            return apply_jit(state, acc)

    def gradients(params, micro_batches):
        """(summed gradients, summed loss) of `micro_batches`, nothing updated (tests)."""
        acc = accumulated(params, micro_batches)
        return acc["grads"], acc["loss"]
    run.gradients = gradients
    run.programs = {"zeros": zeros_jit, "accumulate": accumulate_jit, "apply": apply_jit}  # AOT (bench/compile.py)
    return run
