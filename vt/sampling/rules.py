"""Sampling rules as pure functions of a logit batch: temperature, top-k, top-p, greedy.

The *sampling distribution* of a row of logits l (length V) is

    q(v) = softmax(l / T)(v) restricted to the candidate set C, renormalised,

where C is the k largest logits (top-k; k = -1 or 0 keeps all V), then, among those in descending order, the
shortest prefix whose probability mass reaches p (top-p: token i is kept when the mass of the tokens ranked
strictly above it is < p, so the most likely token is always kept). Temperature T = 0 is greedy decoding:
q is a point mass on argmax l and its log-probability is 0. Ties keep the lower token id first.

The log-probabilities returned with every sampled token are log q(token), the distribution the token was
actually drawn from (what the learner's importance-sampling correction needs), not the model's raw softmax.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vt import VtError

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Static sampling rule (part of the compile key: changing it compiles a new decode step)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    def __post_init__(self):
        if not self.temperature >= 0:
            raise VtError(f"sampling: temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise VtError(f"sampling: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise VtError(f"sampling: top_k must be -1 (off) or >= 1, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def candidates(logits_BV: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array | None]:
    """Temperature-scaled candidate logits and their token ids.

    Returns (scaled_BC, ids_BC): tokens outside the candidate set have scaled logit -inf. Without top-k/top-p
    no sort is done: C = V and ids is None (the column index is the token id). With top-k, C = k (one
    `lax.top_k`); with top-p only, C = V in descending order (a full sort).
    """
    x_BV = logits_BV.astype(jnp.float32) / params.temperature
    V = x_BV.shape[-1]
    top_k = min(params.top_k, V) if params.top_k > 0 else -1
    if top_k < 0 and params.top_p >= 1.0:
        return x_BV, None
    vals_BC, ids_BC = jax.lax.top_k(x_BV, top_k if top_k > 0 else V)
    if params.top_p < 1.0:
        probs_BC = jax.nn.softmax(vals_BC, axis=-1)
        mass_above_BC = jnp.cumsum(probs_BC, axis=-1) - probs_BC
        vals_BC = jnp.where(mass_above_BC < params.top_p, vals_BC, NEG_INF)
    return vals_BC, ids_BC


def sampling_logprobs(logits_BV: jax.Array, params: SamplingParams) -> jax.Array:
    """log q over the whole vocabulary, [B, V] (-inf outside the candidate set). A reference for tests and
    for callers that want the full distribution; the decode loop uses :func:`sample` instead."""
    if params.greedy:
        best_B = jnp.argmax(logits_BV, axis=-1)
        return jnp.where(jnp.arange(logits_BV.shape[-1]) == best_B[:, None], 0.0, NEG_INF)
    vals_BC, ids_BC = candidates(logits_BV, params)
    logq_BC = jax.nn.log_softmax(vals_BC, axis=-1)
    if ids_BC is None:
        return logq_BC
    out = jnp.full(logits_BV.shape, NEG_INF, jnp.float32)
    return jax.vmap(lambda o, i, v: o.at[i].set(v))(out, ids_BC, logq_BC)


def sample(keys_B: jax.Array, logits_BV: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row with its own key. Returns (tokens_B int32, logprobs_B float32 = log q(token)).

    Each row uses only its own key, so a row's draw does not depend on which other rows share the batch
    (the engine derives keys from (request, sample, step); slot refill and sharding then change nothing).
    """
    if params.greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32), jnp.zeros(logits_BV.shape[:1], jnp.float32)
    vals_BC, ids_BC = candidates(logits_BV, params)
    logq_BC = jax.nn.log_softmax(vals_BC, axis=-1)
    choice_B = jax.vmap(jax.random.categorical)(keys_B, vals_BC)
    logprob_B = jnp.take_along_axis(logq_BC, choice_B[:, None], axis=-1)[:, 0]
    token_B = choice_B if ids_BC is None else jnp.take_along_axis(ids_BC, choice_B[:, None], axis=-1)[:, 0]
    return token_B.astype(jnp.int32), logprob_B
