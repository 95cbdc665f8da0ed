"""A paged KV cache on device: the page pool, writing tokens into pages, and decode attention over pages.

The pool holds, per layer, K and V pages [L, K, pages, page_size, H] (the layout of the TPU Pallas
paged-attention kernel per layer, with the layer axis in front so a scan over layers can carry it). A decode
slot b owns the pages listed in row b of a page table [B, max_pages]; its token at position p lives at
offset p % page_size of page table[b, p // page_size]. Which page belongs to whom is decided on the host
(vt.sampling.pages); entries a slot does not own hold num_pages, where writes are dropped and reads clamp.

Shape letters as in vt.model.qwen2, plus: M max pages per slot, R pages per attention block, Z page size.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vt.model import online_softmax

from vt.sharding import param_sharding

# Logical axes of a page pool [L, K, P, Z, H]: split over KV heads (tensor) and replicated over the batch axes,
# since any slot may own any page.
PAGE_POOL_AXES = (None, "kv_heads", None, None, None)

# Pages per block of the decode attention's online softmax (the XLA path), and per compute block on TPU.
PAGES_PER_BLOCK = 8


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedKVCache:
    """The pool of every layer plus the page table of the slots being run. A pytree (donated to jit)."""
    k: jax.Array           # [L, K, P, Z, H]
    v: jax.Array           # [L, K, P, Z, H]
    page_table: jax.Array  # [B, M] int32
    # Decode attention reads exactly this many page blocks, unrolled, instead of looping up to the longest
    # slot: the form bench/sampler.py --roofline hands to XLA's cost analysis (which counts a loop body once).
    static_blocks: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @classmethod
    def zeros(cls, cfg, num_pages: int, page_size: int, page_table, dtype=None) -> "PagedKVCache":
        shape = (cfg.num_layers, cfg.num_kv_heads, num_pages, page_size, cfg.head_dim)
        dtype = dtype or jnp.dtype(cfg.dtype)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), page_table=page_table)

    @classmethod
    def shardings(cls, cfg, mesh, page_table) -> "PagedKVCache":
        """The NamedShardings of a cache on `mesh` (`PAGE_POOL_AXES`), with `page_table` the page table's (split
        over slots while decoding, replicated while prefilling)."""
        pool = param_sharding(PAGE_POOL_AXES, (cfg.num_layers, cfg.num_kv_heads, 1, 1, cfg.head_dim), mesh,
                              "KV page pool")
        return cls(k=pool, v=pool, page_table=page_table)

    @property
    def page_size(self) -> int:
        return self.k.shape[3]

    @property
    def num_pages(self) -> int:
        return self.k.shape[2]


def write_pages(pool_LKPZH, layer: int, new_BTKH, positions_BT, page_table_BM, slot_loop: bool = False):
    """Write each token's key (or value) of `layer` at its page and offset. Tokens whose page entry is
    unowned (= num_pages) are dropped: prefill padding past a prompt's pages writes nothing.

    slot_loop (single-token steps, owned pages only): one dynamic-update-slice per slot in a loop instead of
    one scatter, the same values. XLA's cost analysis counts a scatter as reading and writing its whole operand
    (the pool) although it updates in place, and a dynamic-update-slice as the bytes it writes; the loop body
    is counted once, leaving out B - 1 tokens (a negligible fraction of a step). Only for the roofline form."""
    Z = pool_LKPZH.shape[3]
    if slot_loop:
        page_B = jnp.take_along_axis(page_table_BM, positions_BT // Z, axis=1)[:, 0]
        new_BKH = new_BTKH[:, 0].astype(pool_LKPZH.dtype)

        def one(b, pool):
            return jax.lax.dynamic_update_slice(pool, new_BKH[b][None, :, None, None, :],
                                                (layer, 0, page_B[b], positions_BT[b, 0] % Z, 0))
        return jax.lax.fori_loop(0, new_BTKH.shape[0], one, pool_LKPZH)
    M = page_table_BM.shape[1]
    page_BT = jnp.take_along_axis(page_table_BM, jnp.clip(positions_BT // Z, 0, M - 1), axis=1)
    page_BT = jnp.where(positions_BT // Z < M, page_BT, pool_LKPZH.shape[2])
    off_BT = positions_BT % Z
    # [B, T, K, H] -> one scatter of B*T rows of K x H into the layer's pool.
    return pool_LKPZH.at[layer, :, page_BT, off_BT].set(new_BTKH.astype(pool_LKPZH.dtype), mode="drop")


def copy_pages(pool_LKPZH, src_W, dst_W):
    """pool[:, :, dst] = pool[:, :, src] for every layer (copy-on-write of a shared, partly filled page).
    dst = num_pages drops the copy (padding)."""
    return pool_LKPZH.at[:, :, dst_W].set(pool_LKPZH[:, :, jnp.clip(src_W, 0, pool_LKPZH.shape[2] - 1)],
                                          mode="drop")


def paged_attention_xla(q_BTNH, k_KPZH, v_KPZH, page_table_BM, positions_BT, scale,
                        pages_per_block: int = PAGES_PER_BLOCK, static_blocks: int | None = None,
                        layer: int | None = None):
    """Queries at `positions_BT` against the pages each slot owns, up to its position (a query at p sees
    positions 0..p of its own slot). The page table is read `pages_per_block` pages at a time, gathering those
    pages of every slot, with an online softmax across blocks (as flash-decoding does); only the blocks up to
    the batch's largest position are read (a while loop), or exactly `static_blocks` blocks unrolled (a form
    whose every byte XLA's cost analysis counts: bench/sampler.py --roofline). fp32 scores and accumulators;
    equal to dense attention up to rounding. With `layer`, k and v are the whole pool [L, K, P, Z, H]."""
    B, T, N, H = q_BTNH.shape
    K, P, Z, _ = k_KPZH.shape[-4:]
    if layer is not None:
        # Slice the layer, then gather: XLA fuses the slice into the gather, which then reads only the gathered
        # pages; a gather indexed by (layer, page) directly is costed as reading the whole pool.
        k_KPZH, v_KPZH = k_KPZH[layer], v_KPZH[layer]
    M = page_table_BM.shape[1]
    R = min(pages_per_block, M)
    if M % R:  # pad the table to whole blocks; the padding is never visible
        page_table_BM = jnp.pad(page_table_BM, ((0, 0), (0, R - M % R)), constant_values=P)
        M = page_table_BM.shape[1]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    dt = q_BTNH.dtype

    def one_block(i, carry):
        pages_BR = jnp.clip(jax.lax.dynamic_slice_in_dim(page_table_BM, i * R, R, axis=1), 0, P - 1)
        k_KBSH = k_KPZH[:, pages_BR].reshape(K, B, R * Z, H).astype(dt)
        v_KBSH = v_KPZH[:, pages_BR].reshape(K, B, R * Z, H).astype(dt)
        visible_BTS = (i * R * Z + jnp.arange(R * Z))[None, None, :] <= positions_BT[:, :, None]
        return online_softmax.fold_block(carry, q_BTKGH, k_KBSH, v_KBSH, visible_BTS, scale, "kbsh")

    carry = online_softmax.start(B, K, N // K, T, H)
    if static_blocks is not None:
        for i in range(static_blocks):
            carry = one_block(i, carry)
    else:
        n_blocks = jnp.minimum(jnp.max(positions_BT) // (R * Z) + 1, M // R)
        carry = jax.lax.fori_loop(0, n_blocks, one_block, carry)
    return online_softmax.finish(carry, dt)


def paged_attention_tpu(q_BTNH, k_KPZH, v_KPZH, page_table_BM, positions_BT, scale,
                        pages_per_block: int = PAGES_PER_BLOCK):
    """One decode query per slot (T = 1) through the Pallas paged-attention kernel that ships with JAX."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    B, T, N, H = q_BTNH.shape
    P = k_KPZH.shape[1]
    M = page_table_BM.shape[1]
    R = min(pages_per_block, M)
    while M % R:  # the kernel wants whole compute blocks
        R -= 1
    out_BNH = paged_attention((q_BTNH[:, 0] * scale).astype(k_KPZH.dtype), k_KPZH, v_KPZH,
                              (positions_BT[:, 0] + 1).astype(jnp.int32), jnp.clip(page_table_BM, 0, P - 1),
                              pages_per_compute_block=R)
    return out_BNH[:, None].astype(q_BTNH.dtype)


@dataclasses.dataclass(frozen=True)
class PagedLayer:
    """What one decoder layer sees of a PagedKVCache while tracing: the whole cache and its layer index."""
    cache: PagedKVCache
    layer: int

    def write(self, k_BTKH, v_BTKH, positions_BT) -> PagedKVCache:
        c = self.cache
        loop = c.static_blocks is not None  # the roofline form: see write_pages
        return PagedKVCache(k=write_pages(c.k, self.layer, k_BTKH, positions_BT, c.page_table, loop),
                            v=write_pages(c.v, self.layer, v_BTKH, positions_BT, c.page_table, loop),
                            page_table=c.page_table, static_blocks=c.static_blocks)


def paged_decode_attention(q_BTNH, cache: PagedKVCache, layer: int, positions_BT, scale):
    """Decode attention of `layer` over pages: the Pallas kernel on TPU for single-token steps, the XLA path
    elsewhere (and for the unrolled cost-analysis form, `cache.static_blocks`)."""
    static_blocks = cache.static_blocks
    if jax.default_backend() == "tpu" and q_BTNH.shape[1] == 1 and static_blocks is None:
        return paged_attention_tpu(q_BTNH, cache.k[layer], cache.v[layer], cache.page_table, positions_BT, scale)
    return paged_attention_xla(q_BTNH, cache.k, cache.v, cache.page_table, positions_BT, scale,
                               static_blocks=static_blocks, layer=layer)
