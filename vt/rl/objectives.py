"""MGPO: the pure functions of the RL objective (RECIPE.md, stage 3). Each has its formula in the docstring.

Shape letters (RL's own, distinct from the model's B, T, N, G, ... of vt.model.qwen2): E prompts in the batch,
C completions (responses) per prompt, Y = E * C completions, T response tokens (padded), so per-response arrays
are [E, C] and per-token arrays [E, C, T] (or flattened [Y, T] where noted).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

AGGREGATIONS = ("seq_mean", "token_mean")


def group_accuracy(correct_EC: jax.Array, valid_EC: jax.Array | None = None) -> jax.Array:
    """p(q) = (1/C) sum_i 1[r_i = 1], from the binary correctness (never from shaped rewards). With `valid`,
    responses whose verifier failed are left out of both counts."""
    c = jnp.asarray(correct_EC, jnp.float32)
    v = jnp.ones_like(c) if valid_EC is None else jnp.asarray(valid_EC, jnp.float32)
    return jnp.sum(c * v, axis=-1) / jnp.maximum(jnp.sum(v, axis=-1), 1.0)


def max_entropy_deviation(p_E: jax.Array) -> jax.Array:
    """D_ME(p || 0.5) = p log(p/0.5) + (1-p) log((1-p)/0.5), with 0 log 0 = 0; equals log 2 - H(p).
    0 at p = 0.5 (the most informative prompt), log 2 at p in {0, 1}."""
    p = jnp.asarray(p_E, jnp.float32)
    return xlogy(p, p) + xlogy(1 - p, 1 - p) + jnp.log(2.0)


def mgpo_weight(p_E: jax.Array, gamma: float) -> jax.Array:
    """w(q) = exp(-gamma * D_ME(p(q) || 0.5)). gamma = 0 gives w = 1, i.e. plain GRPO."""
    return jnp.exp(-gamma * max_entropy_deviation(p_E))


def group_advantages(rewards_EC: jax.Array, eps: float = 1e-6, ddof: int = 1,
                     valid_EC: jax.Array | None = None) -> jax.Array:
    """A_i = (r_i - mean_C r) / (std_C r + eps), per group. A group whose rewards are all equal gets A = 0
    (its numerator is exactly 0), never NaN. ddof=1 is the unbiased std that verl's and TRL's GRPO use.
    With `valid`, the statistics use only valid responses and invalid ones get A = 0 (no learning signal
    either way from a response whose correctness is unknown)."""
    r = jnp.asarray(rewards_EC, jnp.float32)
    v = jnp.ones_like(r) if valid_EC is None else jnp.asarray(valid_EC, jnp.float32)
    n = jnp.sum(v, axis=-1, keepdims=True)
    mean = jnp.sum(r * v, axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
    centred = (r - mean) * v
    var = jnp.sum(centred * centred, axis=-1, keepdims=True) / jnp.maximum(n - ddof, 1.0)
    return centred / (jnp.sqrt(var) + eps)


def mgpo_advantages(rewards_EC, correct_EC, gamma: float, eps: float = 1e-6, ddof: int = 1, valid_EC=None):
    """(w(q) * A_i, w(q)): advantages from the (possibly Long2Short-shaped) rewards, weight from the binary
    correctness."""
    w_E = mgpo_weight(group_accuracy(correct_EC, valid_EC), gamma)
    return w_E[:, None] * group_advantages(rewards_EC, eps, ddof, valid_EC), w_E


def truncated_importance_weight(learner_logp, sampler_logp, cap: float) -> jax.Array:
    """Per-token min(pi_learner / pi_sampler, C): corrects for the sampler's numerics differing from the
    learner's. A constant (no gradient flows through it)."""
    ratio = jnp.exp(jnp.asarray(learner_logp, jnp.float32) - jnp.asarray(sampler_logp, jnp.float32))
    return jax.lax.stop_gradient(jnp.minimum(ratio, cap))


def surrogate_per_token(logp, old_logp, adv, *, eps_low: float, eps_high: float, is_weight=None):
    """Per token: min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A) * is_weight_t with rho_t =
    pi_theta(y_t) / pi_old(y_t); `adv` broadcasts against the token arrays (per row [Y, 1] or per token).
    Returns (values, ratio, clipped) where `clipped` marks the tokens the clip bound (no gradient there)."""
    ratio = jnp.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = jnp.minimum(unclipped, clipped)
    if is_weight is not None:
        per_token = per_token * is_weight
    return per_token, ratio, clipped < unclipped


def clipped_surrogate(logp_YT, old_logp_YT, adv_Y, mask_YT, *, eps_low: float, eps_high: float,
                      aggregation: str = "seq_mean", is_weight_YT=None):
    """The clipped policy-gradient objective J (to be maximised), for Y = E*C responses of T tokens, one per
    row (the padded layout; the learner's packed rows use objective_weights for the same J):

        rho_t = pi_theta(y_t) / pi_old(y_t)
        J = agg( min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A) * is_weight_t )

    agg = "seq_mean": (1/Y) sum_i (1/|y_i|) sum_t (RECIPE's J); "token_mean": sum over all tokens / all tokens.
    Returns (J, metrics) with the clip fraction and mean ratio over unmasked tokens."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    mask = mask_YT.astype(jnp.float32)
    per_token, ratio, clipped = surrogate_per_token(logp_YT, old_logp_YT, adv_Y[:, None], eps_low=eps_low,
                                                    eps_high=eps_high, is_weight=is_weight_YT)
    J = aggregate(per_token, mask, aggregation)
    n_tok = jnp.maximum(mask.sum(), 1.0)
    metrics = {
        "clip_fraction": jnp.sum(clipped * mask) / n_tok,
        "ratio_mean": jnp.sum(ratio * mask) / n_tok,
    }
    return J, metrics


def objective_weights(completion_tokens_Y: np.ndarray, aggregation: str, n_sequences: int, n_tokens: int
                      ) -> np.ndarray:
    """Each completion token's weight in J, per sequence ([Y] float64), so that J = sum over the completion
    tokens of every sequence of weight * per-token value equals `aggregate` over the padded rows, wherever
    (packed row, micro-batch, process) the tokens are computed:

        seq_mean:    1 / (n_sequences * max(|y_i|, 1))    (RECIPE's J: the mean over sequences of their mean)
        token_mean:  1 / max(n_tokens, 1)

    n_sequences and n_tokens count the whole mini-batch (every process's share), |y_i| = completion_tokens_Y."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    lengths = np.asarray(completion_tokens_Y, np.float64)
    if aggregation == "seq_mean":
        return 1.0 / (max(n_sequences, 1) * np.maximum(lengths, 1.0))
    return np.full(lengths.shape, 1.0 / max(n_tokens, 1))


def aggregate(per_token_YT, mask_YT, aggregation: str):
    mask = mask_YT.astype(jnp.float32)
    if aggregation == "seq_mean":
        lengths = jnp.maximum(mask.sum(-1), 1.0)
        return jnp.mean(jnp.sum(per_token_YT * mask, -1) / lengths)
    return jnp.sum(per_token_YT * mask) / jnp.maximum(mask.sum(), 1.0)


def kl_to_reference(logp_YT, ref_logp_YT):
    """Per-token k3 estimator of KL(pi_theta || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    d = ref_logp_YT - logp_YT
    return jnp.exp(d) - d - 1.0
