"""The device side of the rollout engine: pure functions the engine jits (prefill, insert, decode chunk).

Shape letters as in vt.model.qwen2, plus: P prompts being prefilled, Q slots being filled from them (n samples
of one prompt share its prefill), C candidate tokens.

The decode batch is B *slots*. Each slot holds one sample: its KV cache row, the token to feed next and its
position, and buffers `tokens`/`logprobs` [B, S] holding each generated token at the cache position it
occupies (a prompt of length L puts its first generated token at L). A finished slot keeps computing (its
position frozen, writes dropped) until the host refills it; the cost is bounded because the decode loop
returns to the host as soon as enough slots are free to be worth a refill.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from vt.model.qwen2 import KVCache
from vt.sampling.rules import SamplingParams, sample


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Slots:
    last_tok: jax.Array   # [B] int32 token whose K/V the next step writes
    pos: jax.Array        # [B] int32 its position (= its cache slot)
    count: jax.Array      # [B] int32 tokens generated so far
    max_new: jax.Array    # [B] int32 the sample ends with `length` when count reaches it
    active: jax.Array     # [B] bool still generating
    stopped: jax.Array    # [B] bool ended by a stop token
    key: jax.Array        # [B, 2] uint32 the sample's key; step t draws with fold_in(key, t)
    tokens: jax.Array     # [B, S] int32 generated tokens at their positions
    logprobs: jax.Array   # [B, S] float32 their log-probs under the sampling distribution

    @classmethod
    def zeros(cls, batch: int, length: int) -> "Slots":
        i = jnp.zeros((batch,), jnp.int32)
        f = jnp.zeros((batch,), bool)
        return cls(last_tok=i, pos=i, count=i, max_new=i, active=f, stopped=f,
                   key=jnp.zeros((batch, 2), jnp.uint32), tokens=jnp.zeros((batch, length), jnp.int32),
                   logprobs=jnp.zeros((batch, length), jnp.float32))


def forward_at(model, tokens_BT, positions_BT, cache: KVCache, idx_B):
    """A cached forward pass with the LM head only at column idx_B of each row: (logits [B, V], cache)."""
    return model(tokens_BT, positions_BT, None, cache, logits_at_B=idx_B)


def prefill(graphdef, state, tokens_PT, lens_P):
    """Run right-padded prompts through a fresh cache of length T. Returns (last logits [P, V], cache [P, T])."""
    model = nnx.merge(graphdef, state)
    P, T = tokens_PT.shape
    positions_PT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (P, T))
    return forward_at(model, tokens_PT, positions_PT, KVCache.zeros(model.cfg, P, T), lens_P - 1)


def insert(cache: KVCache, slots: Slots, small: KVCache, logits_PV, src_Q, dst_Q, lens_Q, max_new_Q, ids_Q,
           base_key, *, params: SamplingParams, stop_ids: tuple[int, ...]):
    """Start Q samples: copy prefilled cache row src_Q[q] into slot dst_Q[q] and draw each sample's first token.

    ids_Q [Q, 2] = (request index, sample index): the sample's key is fold_in(fold_in(base_key, i), j), so its
    tokens do not depend on the slot it lands in. Rows with dst_Q = B (padding of the Q bucket) are dropped.
    """
    T = small.k[0].shape[1]
    keys_Q = jax.vmap(lambda ij: jax.random.fold_in(jax.random.fold_in(base_key, ij[0]), ij[1]))(ids_Q)
    step_keys_Q = jax.vmap(jax.random.fold_in)(keys_Q, jnp.zeros_like(lens_Q))
    tok_Q, lp_Q = sample(step_keys_Q, logits_PV[src_Q], params)
    put = lambda buf, val: buf.at[dst_Q].set(val, mode="drop")  # noqa: E731
    cache = KVCache(k=[buf.at[dst_Q, :T].set(new[src_Q].astype(buf.dtype), mode="drop")
                       for buf, new in zip(cache.k, small.k)],
                    v=[buf.at[dst_Q, :T].set(new[src_Q].astype(buf.dtype), mode="drop")
                       for buf, new in zip(cache.v, small.v)])
    hit_Q = jnp.isin(tok_Q, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros_like(tok_Q, bool)
    slots = Slots(last_tok=put(slots.last_tok, tok_Q), pos=put(slots.pos, lens_Q), count=put(slots.count, 1),
                  max_new=put(slots.max_new, max_new_Q), active=put(slots.active, ~hit_Q & (max_new_Q > 1)),
                  stopped=put(slots.stopped, hit_Q), key=put(slots.key, keys_Q),
                  tokens=slots.tokens.at[dst_Q, lens_Q].set(tok_Q, mode="drop"),
                  logprobs=slots.logprobs.at[dst_Q, lens_Q].set(lp_Q, mode="drop"))
    return cache, slots


def decode(graphdef, state, cache: KVCache, slots: Slots, max_steps, min_free, *, params: SamplingParams,
           stop_ids: tuple[int, ...]):
    """Decode all slots on device until `max_steps` steps ran, no slot is active, or at least `min_free` slots
    are inactive (enough to be worth a refill). Returns (cache, slots, steps run)."""
    model = nnx.merge(graphdef, state)
    B, S = slots.tokens.shape
    rows_B = jnp.arange(B)
    stop_arr = jnp.asarray(stop_ids, jnp.int32)

    def cond(carry):
        _, s, i = carry
        n_free = jnp.sum(~s.active)
        return (i < max_steps) & (n_free < min_free) & jnp.any(s.active)

    def body(carry):
        cache, s, i = carry
        logits_B1V, cache = model(s.last_tok[:, None], s.pos[:, None], cache=cache)
        keys_B = jax.vmap(jax.random.fold_in)(s.key, s.count)
        tok_B, lp_B = sample(keys_B, logits_B1V[:, 0], params)
        act = s.active
        at_B = jnp.where(act, s.pos + 1, S)  # S is out of range: inactive rows write nothing
        count = s.count + act
        pos = jnp.where(act, s.pos + 1, s.pos)
        hit = (jnp.isin(tok_B, stop_arr) if stop_ids else jnp.zeros_like(act)) & act
        s = Slots(last_tok=jnp.where(act, tok_B, s.last_tok), pos=pos, count=count, max_new=s.max_new,
                  active=act & ~hit & (count < s.max_new) & (pos + 1 < S), stopped=s.stopped | hit, key=s.key,
                  tokens=s.tokens.at[rows_B, at_B].set(tok_B, mode="drop"),
                  logprobs=s.logprobs.at[rows_B, at_B].set(lp_B, mode="drop"))
        return cache, s, i + 1

    return jax.lax.while_loop(cond, body, (cache, slots, jnp.int32(0)))


def deactivate(slots: Slots, mask_B):
    """End the masked slots (a stop string was found on the host)."""
    return dataclasses.replace(slots, active=slots.active & ~mask_B, stopped=slots.stopped | mask_B)
