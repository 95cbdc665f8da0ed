"""The jitted pure functions of the RL learner.

    token_logps(params, batch) -> logp [N, T]            log pi(target) at every position (no gradient)
    rl_step(state, batch) -> (state, metrics)            one optimiser update on the MGPO objective, donated

`batch` rows are prompt + completion (vt.rl.rollouts.build_batch) with `mask` on completion targets, adv
(w(q) * A_i per row), sampler_logp, ref_logp when a KL term is used, and old_logp (pi_old: the learner before
this batch's first update). With one update per batch pi_old is the current policy, so old_logp may be left
out: the step then takes it as stop_gradient(logp), saving a forward pass. The truncated importance weight
min(pi_old / pi_sampler, C) is a constant computed from old_logp and sampler_logp.
Logits are divided by the sampling temperature before the softmax, so pi is the distribution that was sampled.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vt.rl.objectives import aggregate, clipped_surrogate, kl_to_reference, truncated_importance_weight
from vt.sharding import logical_to_spec, use_mesh
from vt.train.losses import token_nll
from vt.train.state import ModelDef, TrainState

ROW_KEYS = ("tokens", "targets", "positions", "segment_ids", "mask", "sampler_logp", "old_logp", "ref_logp")


def batch_shardings(mesh: Mesh, keys) -> dict[str, NamedSharding]:
    rows = NamedSharding(mesh, logical_to_spec(("batch", "sequence")))
    vec = NamedSharding(mesh, logical_to_spec(("batch",)))
    return {k: (vec if k == "adv" else rows) for k in keys}


def _logits(md: ModelDef, params, batch, temperature: float):
    logits = md.apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])
    return logits / temperature if temperature not in (0.0, 1.0) else logits


def make_token_logps(md: ModelDef, mesh: Mesh, temperature: float):
    @jax.jit
    def token_logps(params, batch):
        logits = _logits(md, params, batch, temperature)
        return -token_nll(logits, batch["targets"])

    def run(params, batch):
        with use_mesh(mesh):
            return token_logps(params, batch)
    return run


def make_rl_step(md: ModelDef, optimizer: optax.GradientTransformation, schedule, state_sh: TrainState, mesh: Mesh,
                 *, temperature: float, eps_low: float, eps_high: float, aggregation: str, kl_coef: float,
                 is_cap: float):
    def loss_fn(params, batch):
        logits = _logits(md, params, batch, temperature)
        logp = -token_nll(logits, batch["targets"])
        old = batch["old_logp"] if "old_logp" in batch else jax.lax.stop_gradient(logp)
        is_weight = truncated_importance_weight(old, batch["sampler_logp"], is_cap)
        J, m = clipped_surrogate(logp, old, batch["adv"], batch["mask"], eps_low=eps_low,
                                 eps_high=eps_high, aggregation=aggregation, is_weight_NT=is_weight)
        mask = batch["mask"]
        m["is_weight_mean"] = aggregate(is_weight, mask, "token_mean")
        m["is_weight_capped"] = aggregate((is_weight >= is_cap).astype(jnp.float32), mask, "token_mean")
        m["mismatch_kl"] = aggregate(kl_to_reference(batch["sampler_logp"], old), mask, "token_mean")
        loss = -J
        if kl_coef:
            kl = aggregate(kl_to_reference(logp, batch["ref_logp"]), batch["mask"], aggregation)
            loss, m["kl_ref"] = loss + kl_coef * kl, kl
        # Entropy of pi at completion positions: a collapse to 0 is the classic RL failure to watch for.
        logp_all = jax.nn.log_softmax(jax.lax.stop_gradient(logits).astype(jnp.float32))
        ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
        m["entropy"] = aggregate(ent, batch["mask"], "token_mean")
        m["objective"] = J
        return loss, m

    def rl_step(state: TrainState, batch):
        (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state, rng=state.rng)
        # A non-finite update is not applied; the host halts the run on `finite = 0` before any save.
        new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
        return new, {**m, "loss": loss, "grad_norm": grad_norm, "lr": schedule(state.step), "finite": finite}

    jitted = jax.jit(rl_step, out_shardings=(state_sh, NamedSharding(mesh, P())), donate_argnums=(0,))

    @functools.wraps(rl_step)
    def run(state, batch):
        with use_mesh(mesh):
            return jitted(state, batch)
    run.jitted = jitted
    return run
