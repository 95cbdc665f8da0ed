"""Token-level losses: pure functions of logits, targets and masks.

Normalisation is per token over the global batch: for the micro-batches m of one optimiser step,
    loss = sum_m sum_{b,t} mask[m,b,t] * nll[m,b,t]  /  max(1, sum_m sum_{b,t} mask[m,b,t])
so every supervised token weighs the same whatever row, document or micro-batch it sits in (a packed row
with many short answers counts as much as their unpacked rows would).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def token_nll(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """-log softmax(logits)[target] per position, in fp32: logsumexp(logits) - logits[target]."""
    logits = logits_BTV.astype(jnp.float32)
    lse_BT = jax.nn.logsumexp(logits, axis=-1)
    target_logit_BT = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return lse_BT - target_logit_BT


def masked_nll_sum(logits_BTV: jax.Array, targets_BT: jax.Array, mask_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of mask * nll, sum of mask). Masked positions contribute exactly 0, even if their logits are
    garbage (jnp.where, not a multiply, so an inf/NaN at a padded position cannot leak into the sum)."""
    mask = mask_BT.astype(jnp.float32)
    nll = token_nll(logits_BTV, targets_BT)
    return jnp.sum(jnp.where(mask > 0, nll * mask, 0.0)), jnp.sum(mask)


def token_mean_loss(logits_BTV, targets_BT, mask_BT, num_tokens=None) -> jax.Array:
    """Masked mean NLL; `num_tokens` is the global normaliser when this is one micro-batch of several."""
    total, count = masked_nll_sum(logits_BTV, targets_BT, mask_BT)
    denom = count if num_tokens is None else num_tokens
    return total / jnp.maximum(denom, 1.0)
