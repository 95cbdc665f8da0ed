"""Long2Short reward shaping (end of math RL): among correct responses, shorter ones earn more.

For one group of G responses to the same prompt with binary rewards r_i and lengths L_i (tokens, >= 1):

    C      = {i : r_i = 1}                      (the correct responses)
    s_i    = 1 / L_i
    s_bar  = (1/|C|) * sum_{j in C} s_j
    r'_i   = r_i + lambda * (s_i - s_bar) / max_{j in C} |s_j - s_bar|     for i in C
    r'_i   = r_i                                                           for i not in C

with lambda = 0.2. Consequences, each a tested property: incorrect responses are untouched; the shifts
sum to zero over C; nothing changes when all correct lengths are equal (the denominator is 0) or
|C| <= 1; every shift lies in [-lambda, lambda]. Group accuracy p(q) for MGPO must still use the binary
r_i, not r'_i.

Pure jax.numpy, vectorised over leading axes (groups on the last axis), jit-friendly.
"""
from __future__ import annotations

import jax.numpy as jnp

LAMBDA = 0.2


def long2short(rewards, lengths, lam: float = LAMBDA):
    """Shaped rewards r' (same shape as ``rewards``, float32) for groups on the last axis.

    Args:
      rewards: [..., G] binary rewards (1 = correct); any value other than exactly 1 counts as incorrect.
      lengths: [..., G] response lengths, >= 1 (clamped to 1 so an empty response cannot divide by 0).
      lam: the shaping scale lambda.
    """
    r = jnp.asarray(rewards, jnp.float32)
    L = jnp.maximum(jnp.asarray(lengths, jnp.float32), 1.0)
    correct = r == 1.0
    n = jnp.sum(correct, axis=-1, keepdims=True)
    s = 1.0 / L
    s_bar = jnp.sum(jnp.where(correct, s, 0.0), axis=-1, keepdims=True) / jnp.maximum(n, 1)
    dev = jnp.where(correct, s - s_bar, 0.0)
    scale = jnp.max(jnp.abs(dev), axis=-1, keepdims=True)
    # Decide "all correct lengths equal" on the lengths themselves: in floating point, s_i - s_bar can be
    # a rounding-size nonzero for equal lengths, which the normalisation would blow up to +-lambda.
    big = jnp.max(jnp.where(correct, L, -jnp.inf), axis=-1, keepdims=True)
    small = jnp.min(jnp.where(correct, L, jnp.inf), axis=-1, keepdims=True)
    shaped = (n > 1) & (big > small) & (scale > 0)
    shift = jnp.where(shaped, lam * dev / jnp.where(shaped, scale, 1.0), 0.0)
    return r + shift
