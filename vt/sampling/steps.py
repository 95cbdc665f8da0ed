"""The device side of the rollout engine: pure functions the engine jits (prefill, insert, decode chunk).

Shape letters as in vt.model.qwen2 and vt.model.kv_pages, plus: A prompts being prefilled, Q slots being filled
from them (n samples of one prompt share its prefill and its full pages), W pages copied, I decode steps per
call (the README's glossary).

The decode batch is B *slots*. Each slot holds one sample: the token to feed next and its position, its
count, length limit and key; its keys and values live in the pages its row of the page table lists (the
host assigns them, vt.sampling.page_table). Per step, the bytes moved are the weights, the slots' live pages and
O(B) state: generated tokens and log-probs go to a per-call output buffer [I, B] that the host drains after
every call, not to a [B, max_len] buffer carried through the loop. A finished slot keeps computing (its
position frozen, its K/V rewritten in place) until the host refills it; the cost is bounded because the
decode loop returns to the host as soon as enough slots are free to be worth a refill.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from vt.model.kv_pages import PagedKVCache, copy_pages
from vt.sampling.rules import SamplingParams, sample
from vt.sharding import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Slots:
    last_tok: jax.Array   # [B] int32 token whose K/V the next step writes
    pos: jax.Array        # [B] int32 its position
    count: jax.Array      # [B] int32 tokens generated so far
    max_new: jax.Array    # [B] int32 the sample ends with `length` when count reaches it
    active: jax.Array     # [B] bool still generating
    stopped: jax.Array    # [B] bool ended by a stop token
    key: jax.Array        # [B, 2] uint32 the sample's key; step t draws with fold_in(key, t)

    @classmethod
    def abstract(cls, batch: int) -> "Slots":
        """The slot state declared once (vt.sharding.ArrayInfo): every field split over slots, as the decode batch
        is; zeros, shardings and abstract values are derived from it."""
        i32, b1 = (ArrayInfo((batch,), jnp.dtype(t), ("batch",)) for t in (jnp.int32, bool))
        return cls(last_tok=i32, pos=i32, count=i32, max_new=i32, active=b1, stopped=b1,
                   key=ArrayInfo((batch, 2), jnp.dtype(jnp.uint32), ("batch", None)))


def prefill(graphdef, state, cache: PagedKVCache, tokens_AT, lens_A, start_A=None):
    """Run right-padded prompts from position 0, writing their keys and values into the pages of
    `cache.page_table` ([A, pages of T]; padding past a prompt's pages is dropped). Returns (last logits [A, V],
    cache). With `start_A` (and a cache that `continues`), row a's tokens sit at positions start_A[a] onward and
    attend to what its pages hold before them: a sample resumed after a tool call, its decoded prefix kept."""
    model = nnx.merge(graphdef, state)
    A, T = tokens_AT.shape
    positions_AT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (A, T))
    if start_A is not None:
        positions_AT = positions_AT + start_A[:, None]
    return model(tokens_AT, positions_AT, None, cache, logits_at_B=lens_A - 1)  # the LM head at each last token only


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Admission:
    """Q samples to start from prefilled prompts (rows past the admitted ones are padding of the Q bucket: dst B,
    dropped; copies to num_pages, dropped)."""
    src: jax.Array       # [Q] int32 the prefill row (prompt) each sample continues
    dst: jax.Array       # [Q] int32 the slot it starts in
    lens: jax.Array      # [Q] int32 its prompt length: the position of its first generated token
    max_new: jax.Array   # [Q] int32 its length limit
    ids: jax.Array       # [Q, 2] int32 (request index, sample index): what its key is folded from
    count: jax.Array     # [Q] int32 tokens its completion already holds (0, or a sample resumed after a tool call)
    copy_src: jax.Array  # [W] int32 shared, partly filled prompt pages ...
    copy_dst: jax.Array  # [W] int32 ... copied here before anyone writes into them (copy-on-write)


def insert(cache: PagedKVCache, slots: Slots, logits_AV, adm: Admission, base_key, *, params: SamplingParams,
           stop_ids: tuple[int, ...]):
    """Start the admitted samples in their slots: copy the shared, partly filled prompt pages and draw each
    sample's first token. Sample (i, j)'s key is fold_in(fold_in(base_key, i), j), so its tokens do not depend on
    the slot it lands in. Returns (cache, slots, first tokens [Q], their log-probs [Q])."""
    keys_Q = jax.vmap(lambda ij: jax.random.fold_in(jax.random.fold_in(base_key, ij[0]), ij[1]))(adm.ids)
    step_keys_Q = jax.vmap(jax.random.fold_in)(keys_Q, adm.count)  # completion token t draws with fold_in(key, t)
    tok_Q, lp_Q = sample(step_keys_Q, logits_AV[adm.src], params)
    put = lambda buf, val: buf.at[adm.dst].set(val, mode="drop")  # noqa: E731
    cache = dataclasses.replace(cache, k=copy_pages(cache.k, adm.copy_src, adm.copy_dst),
                                v=copy_pages(cache.v, adm.copy_src, adm.copy_dst))
    hit_Q = jnp.isin(tok_Q, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros_like(tok_Q, bool)
    count_Q = adm.count + 1
    slots = Slots(last_tok=put(slots.last_tok, tok_Q), pos=put(slots.pos, adm.lens), count=put(slots.count, count_Q),
                  max_new=put(slots.max_new, adm.max_new), active=put(slots.active, ~hit_Q & (count_Q < adm.max_new)),
                  stopped=put(slots.stopped, hit_Q), key=put(slots.key, keys_Q))
    return cache, slots, tok_Q, lp_Q


def decode(graphdef, state, cache: PagedKVCache, slots: Slots, max_steps, min_free, *, params: SamplingParams,
           stop_ids: tuple[int, ...], steps_per_call: int):
    """Decode all slots on device until `max_steps` (<= steps_per_call) steps ran, no slot is active, or at
    least `min_free` slots are inactive (enough to be worth a refill). The host gave every active slot pages
    for `max_steps` more tokens. Returns (cache, slots, steps run, tokens [I, B], log-probs [I, B]): row t holds
    step t's draws, -1 where the slot was not active."""
    model = nnx.merge(graphdef, state)
    B = slots.pos.shape[0]

    def cond(carry):
        _, s, i, _, _ = carry
        n_free = jnp.sum(~s.active)
        return (i < max_steps) & (n_free < min_free) & jnp.any(s.active)

    def body(carry):
        cache, s, i, out_tok, out_lp = carry
        cache, s, tok_B, lp_B = decode_step(model, cache, s, params, stop_ids)
        out_tok = jax.lax.dynamic_update_index_in_dim(out_tok, tok_B, i, 0)
        out_lp = jax.lax.dynamic_update_index_in_dim(out_lp, lp_B, i, 0)
        return cache, s, i + 1, out_tok, out_lp

    out = (jnp.full((steps_per_call, B), -1, jnp.int32), jnp.zeros((steps_per_call, B), jnp.float32))
    return jax.lax.while_loop(cond, body, (cache, slots, jnp.int32(0), *out))


def decode_step(model, cache: PagedKVCache, s: Slots, params: SamplingParams, stop_ids: tuple[int, ...]):
    """One decode step of every slot: (cache, slots, token [B] (-1 where inactive), log-prob [B])."""
    logits_B1V, cache = model(s.last_tok[:, None], s.pos[:, None], cache=cache)
    keys_B = jax.vmap(jax.random.fold_in)(s.key, s.count)
    tok_B, lp_B = sample(keys_B, logits_B1V[:, 0], params)
    act = s.active
    count = s.count + act
    pos = jnp.where(act, s.pos + 1, s.pos)
    hit = (jnp.isin(tok_B, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros_like(act)) & act
    s = Slots(last_tok=jnp.where(act, tok_B, s.last_tok), pos=pos, count=count, max_new=s.max_new,
              active=act & ~hit & (count < s.max_new), stopped=s.stopped | hit, key=s.key)
    return cache, s, jnp.where(act, tok_B, -1), lp_B


def deactivate(slots: Slots, mask_B):
    """End the masked slots (a stop string was found on the host)."""
    return dataclasses.replace(slots, active=slots.active & ~mask_B, stopped=slots.stopped | mask_B)
