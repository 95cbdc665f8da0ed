"""The KV cache on device: a pool of pages, writing tokens into them, and attention over them.

The pool holds, per layer, K and V pages [L, K, pages, page_size, H] (the layout of the TPU Pallas
paged-attention kernel per layer, with the layer axis in front so a scan over layers can carry it). Slot (row) b
owns the pages listed in row b of a page table [B, max_pages]; its token at position p lives at offset
p % page_size of page table[b, p // page_size]. Which page belongs to whom is decided on the host: the sampler's
page tables (vt.sampling.page_table), or a fixed table where each row owns its own run of pages (`for_rows`, for
distill scoring and tests). Entries a slot does not own hold num_pages, where writes are dropped and reads clamp.

The model sees the cache through two methods, `write` and `attend` (vt.model.qwen2.Attention). Shape letters as
in vt.model.qwen2, plus: M max pages per slot, R pages per attention block, Z page size.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from vt.model import online_softmax
from vt.model.attention import self_attention
from vt.sharding import ArrayInfo, activation_spec, platform, shardings_of, zeros_of

# Logical axes of a page pool [L, K, P, Z, H]: split over KV heads (tensor) and replicated over the batch axes,
# since any slot may own any page.
PAGE_POOL_AXES = (None, "kv_heads", None, None, None)

# Pages per block of the decode attention's online softmax (the XLA path), and per compute block of the kernels.
PAGES_PER_BLOCK = 8

@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedKVCache:
    """The pool of every layer plus the page table of the slots being run. A pytree (donated to jit)."""
    k: jax.Array           # [L, K, P, Z, H]
    v: jax.Array           # [L, K, P, Z, H]
    page_table: jax.Array  # [B, M] int32
    # False (the sampler): a call of several tokens is a prompt written from position 0 into fresh pages, so its
    # tokens attend to one another as without a cache (vt.model.attention). True (chunked scoring): every call
    # continues what the pages already hold and attends to them.
    continues: bool = dataclasses.field(default=False, metadata=dict(static=True))
    # The kernel of a single-token step (vt.sampling.config.DECODE_KERNELS): "auto" is the Pallas kernel on TPU
    # (heads of 128 or a multiple: `tpu_kernel_fits`) and the XLA path elsewhere; "pallas" also takes JAX's Pallas
    # (Triton) kernel on GPU, and on CPU runs that kernel in Pallas's interpreter (tests); "xla" always takes the
    # XLA path.
    decode_kernel: str = dataclasses.field(default="auto", metadata=dict(static=True))
    # `unroll` of the model's scan over layers while this cache rides in it (bench/sampler.py's cost-analysis
    # form unrolls them).
    scan_unroll: ClassVar[int] = 1

    @classmethod
    def abstract(cls, cfg, num_pages: int, page_size: int, table: ArrayInfo, dtype=None, **static) -> "PagedKVCache":
        """The cache declared once: ArrayInfo leaves (shape, dtype, logical axes: `PAGE_POOL_AXES`), with `table`
        the page table's (`table_info`). Its zeros, shardings and abstract values are derived from this
        (vt.sharding.zeros_of / shardings_of / abstract_of); `static`: continues, decode_kernel."""
        pool = ArrayInfo((cfg.num_layers, cfg.num_kv_heads, num_pages, page_size, cfg.head_dim),
                         jnp.dtype(dtype or cfg.dtype), PAGE_POOL_AXES)
        return cls(k=pool, v=pool, page_table=table, **static)

    @staticmethod
    def table_info(rows: int, pages: int) -> ArrayInfo:
        """A page table [rows, pages]; where it lives depends on the call (split over slots while decoding,
        replicated while prefilling), so the sharding is the caller's (`shardings`)."""
        return ArrayInfo((rows, pages), jnp.dtype(jnp.int32), (None, None))

    @classmethod
    def for_rows(cls, cfg, batch: int, length: int, page_size: int, dtype=None) -> "PagedKVCache":
        """A cache of `batch` rows of `length` positions, row r owning pages r*M .. r*M + M - 1 (a fixed table),
        whose calls continue one another (`continues`): chunked scoring, or any prefill then decode by hand."""
        M = -(-length // page_size)
        table = jnp.asarray(np.arange(batch * M, dtype=np.int32).reshape(batch, M))
        spec = cls.abstract(cfg, batch * M, page_size, cls.table_info(batch, M), dtype, continues=True)
        return dataclasses.replace(zeros_of(spec), page_table=table)

    @classmethod
    def shardings(cls, cfg, mesh, page_table, decode_kernel: str = "auto") -> "PagedKVCache":
        """The NamedShardings of a cache on `mesh`, with `page_table` the page table's (the pool's pages are never
        split, so any count gives them)."""
        spec = cls.abstract(cfg, 1, 1, cls.table_info(1, 1), decode_kernel=decode_kernel)
        return dataclasses.replace(shardings_of(spec, mesh, "KV page pool"), page_table=page_table)

    @property
    def page_size(self) -> int:
        return self.k.shape[3]

    @property
    def num_pages(self) -> int:
        return self.k.shape[2]

    def write(self, layer, k_BTKH, v_BTKH, positions_BT) -> "PagedKVCache":
        """The cache with layer `layer`'s keys and values of these tokens written at their positions."""
        return dataclasses.replace(self, k=write_pages(self.k, layer, k_BTKH, positions_BT, self.page_table),
                                   v=write_pages(self.v, layer, v_BTKH, positions_BT, self.page_table))

    def attend(self, layer, q_BTNH, k_BTKH, v_BTKH, positions_BT, segment_ids_BT, impl: str):
        """Attention of layer `layer`'s queries at `positions_BT`, after `write`: a prompt prefilled into fresh pages
        attends to its own keys and values (k, v) like the no-cache path, with `impl`; a decode step (or a
        continuing chunk) attends to the pages, single tokens through `decode_kernel`."""
        T = q_BTNH.shape[1]
        if T > 1 and not self.continues:
            return self_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, impl)
        scale = q_BTNH.shape[-1] ** -0.5
        backend = platform()  # the devices this program is built for (a TPU topology compiled from a CPU host too)
        if T == 1 and backend == "tpu" and self.decode_kernel != "xla" and tpu_kernel_fits(q_BTNH.shape[-1]):
            return paged_attention_tpu(q_BTNH, self.k[layer], self.v[layer], self.page_table, positions_BT, scale)
        if T == 1 and self.decode_kernel == "pallas":
            return paged_attention_gpu(q_BTNH, self.k, self.v, self.page_table, positions_BT, scale, layer,
                                       interpret=backend != "gpu")
        return paged_attention_xla(q_BTNH, self.k, self.v, self.page_table, positions_BT, scale, layer=layer)


def write_pages(pool_LKPZH, layer: int, new_BTKH, positions_BT, page_table_BM):
    """Write each token's key (or value) of `layer` at its page and offset. Tokens whose page entry is
    unowned (= num_pages) are dropped: prefill padding past a prompt's pages writes nothing."""
    Z = pool_LKPZH.shape[3]
    M = page_table_BM.shape[1]
    page_BT = jnp.take_along_axis(page_table_BM, jnp.clip(positions_BT // Z, 0, M - 1), axis=1)
    page_BT = jnp.where(positions_BT // Z < M, page_BT, pool_LKPZH.shape[2])
    off_BT = positions_BT % Z
    # [B, T, K, H] -> one scatter of B*T*K rows of H into the layer's pool. Each KV head indexed (not a window of
    # the update) keeps the pool in its own row-major layout: with K x H windows the TPU compiler lays the pool out
    # K-minor inside the layer scan and copies all of it in and out of that layout every decode call (a second
    # pool's worth of HBM: vt plan, coder-3b on v5p-8, decode temp 48.6 GB beside a 42.9 GB pool).
    K = pool_LKPZH.shape[1]
    k_BTK = jnp.broadcast_to(jnp.arange(K, dtype=page_BT.dtype), (*page_BT.shape, K))
    return pool_LKPZH.at[layer, k_BTK, page_BT[..., None], off_BT[..., None]].set(
        new_BTKH.astype(pool_LKPZH.dtype), mode="drop")


def copy_pages(pool_LKPZH, src_W, dst_W):
    """pool[:, :, dst] = pool[:, :, src] for every layer (copy-on-write of a shared, partly filled page).
    dst = num_pages drops the copy (padding)."""
    return pool_LKPZH.at[:, :, dst_W].set(pool_LKPZH[:, :, jnp.clip(src_W, 0, pool_LKPZH.shape[2] - 1)],
                                          mode="drop")


def gather_pages(pool, pages_BR, layer=None):
    """Pages `pages_BR` of every KV head, [K, B, R, Z, H], from a pool [K, P, Z, H] or, with `layer`, from layer
    `layer` of a pool [L, K, P, Z, H]: one gather indexed by (layer, page) that reads only those pages. (Slicing
    the layer first is not free: XLA copies the layer's whole pool out of the scan's carry before the gather,
    every layer of every decode step: 3.5 ms of coder-3b's 20 ms decode step on an H200, and on CPU
    bench/sampler.py's vt ran 1.5-1.8x faster without it.)"""
    lead = () if layer is None else (1,)  # the layer axis, collapsed
    idx_BRI = pages_BR[..., None] if layer is None else jnp.stack(
        [jnp.broadcast_to(jnp.asarray(layer, pages_BR.dtype), pages_BR.shape), pages_BR], axis=-1)
    a = len(lead)  # position of the KV-head axis in the pool
    dims = jax.lax.GatherDimensionNumbers(offset_dims=(0, 3, 4), collapsed_slice_dims=(*range(a), a + 1),
                                          start_index_map=(*range(a), a + 1))
    return jax.lax.gather(pool, idx_BRI, dims, slice_sizes=(*lead, pool.shape[a], 1, *pool.shape[a + 2:]),
                          mode="clip")


def page_blocks(q_BTNH, k_KPZH, v_KPZH, page_table_BM, positions_BT, scale, pages_per_block: int = PAGES_PER_BLOCK,
                layer: int | None = None, slice_layer: bool = False):
    """The pieces of paged attention: (fold(i, carry): block i of `pages_per_block` pages folded into an online
    softmax, the empty carry, the number of blocks the table holds, the blocks up to the batch's largest
    position). `paged_attention_xla` loops over them; bench/sampler.py's cost form unrolls them, with `slice_layer`:
    XLA's CPU cost analysis charges a gather indexed by (layer, page) the whole pool, but fuses a layer slice
    into the gather and then charges only the gathered pages."""
    B, T, N, H = q_BTNH.shape
    K, P, Z, _ = k_KPZH.shape[-4:]
    if layer is not None and slice_layer:
        k_KPZH, v_KPZH, layer = k_KPZH[layer], v_KPZH[layer], None
    M = page_table_BM.shape[1]
    R = min(pages_per_block, M)
    if M % R:  # pad the table to whole blocks; the padding is never visible
        page_table_BM = jnp.pad(page_table_BM, ((0, 0), (0, R - M % R)), constant_values=P)
        M = page_table_BM.shape[1]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    dt = q_BTNH.dtype

    def fold(i, carry):
        pages_BR = jnp.clip(jax.lax.dynamic_slice_in_dim(page_table_BM, i * R, R, axis=1), 0, P - 1)
        k_KBSH = gather_pages(k_KPZH, pages_BR, layer).reshape(K, B, R * Z, H).astype(dt)
        v_KBSH = gather_pages(v_KPZH, pages_BR, layer).reshape(K, B, R * Z, H).astype(dt)
        visible_BTS = (i * R * Z + jnp.arange(R * Z))[None, None, :] <= positions_BT[:, :, None]
        return online_softmax.fold_block(carry, q_BTKGH, k_KBSH, v_KBSH, visible_BTS, scale, "kbsh")

    live = jnp.minimum(jnp.max(positions_BT) // (R * Z) + 1, M // R)
    return fold, online_softmax.start(B, K, N // K, T, H), M // R, live


def paged_attention_xla(q_BTNH, k_KPZH, v_KPZH, page_table_BM, positions_BT, scale,
                        pages_per_block: int = PAGES_PER_BLOCK, layer: int | None = None):
    """Queries at `positions_BT` against the pages each slot owns, up to its position (a query at p sees
    positions 0..p of its own slot). The page table is read `pages_per_block` pages at a time, gathering those
    pages of every slot, with an online softmax across blocks (as flash-decoding does); only the blocks up to
    the batch's largest position are read (a while loop). fp32 scores and accumulators; equal to dense attention
    up to rounding. With `layer`, k and v are the whole pool [L, K, P, Z, H]."""
    fold, carry, _, live = page_blocks(q_BTNH, k_KPZH, v_KPZH, page_table_BM, positions_BT, scale, pages_per_block,
                                       layer)
    return online_softmax.finish(jax.lax.fori_loop(0, live, fold, carry), q_BTNH.dtype)


def tpu_kernel_fits(head_dim: int) -> bool:
    """Can `paged_attention_tpu` lower for this head dimension? Mosaic wants the kernel's last block dimension (the
    head dimension of q and of its per-head max and sum outputs) in whole 128-lane tiles: Qwen2.5 from 1.5B up has
    heads of 128; 0.5B (64) and the tiny preset (16) decode through the XLA path on TPU too."""
    return head_dim % 128 == 0


def paged_attention_tpu(q_BTNH, k_KPZH, v_KPZH, page_table_BM, positions_BT, scale,
                        pages_per_block: int = PAGES_PER_BLOCK):
    """One decode query per slot (T = 1) through the Pallas paged-attention kernel that ships with JAX
    (`jax.experimental.pallas.ops.tpu.paged_attention`), under `jax.shard_map` when a mesh is set.

    Why this kernel and not `ragged_paged_attention` (vLLM-TPU's): its inputs are exactly the pool's layout and the
    sampler's page table. It reads pages [K, P, Z, H] per KV head (one layer of the pool [L, K, P, Z, H]), a page
    table [B, M] of page ids and one length per slot; prefix sharing is pages listed in several rows, preemption
    and refill are rows of the table rewritten on the host, and unowned entries (= P) are clamped and masked by
    the length. The ragged kernel wants K and V interleaved in one pool [P, Z, 2K, H] and a flattened query batch
    with cumulative lengths: a different pool layout for every writer (prefill, copy-on-write, the XLA path) for a
    kernel whose advantage, mixing prefill and decode tokens in one call, the sampler does not use (it prefills
    with the no-cache attention). Not yet timed against it on a TPU.

    Sharding: Mosaic kernels cannot be partitioned by XLA ("wrap the call in a shard_map"), so under a mesh each
    device runs the kernel on its own slots (the page table and lengths split over the batch axes, as the decode
    batch is) and KV heads (the pool split over `kv_heads`, as `PAGE_POOL_AXES`); every device holds every page of
    its KV heads, since any slot may own any page. Query heads split with the KV heads, keeping each group local;
    when the KV heads do not split (fewer than the tensor axis: REPLICATE_IF_INDIVISIBLE), neither do the query
    heads."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    B, T, N, H = q_BTNH.shape
    K, P = k_KPZH.shape[:2]
    M = page_table_BM.shape[1]
    R = min(pages_per_block, M)
    while M % R:  # the kernel wants whole compute blocks
        R -= 1

    def local(q_BNH, k, v, lengths_B, table_BM):
        return paged_attention(q_BNH, k, v, lengths_B, table_BM, pages_per_compute_block=R)

    args = ((q_BTNH[:, 0] * scale).astype(k_KPZH.dtype), k_KPZH, v_KPZH,
            (positions_BT[:, 0] + 1).astype(jnp.int32), jnp.clip(page_table_BM, 0, P - 1))
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out_BNH = local(*args)
    else:
        batch = activation_spec((B,), ("batch",), mesh)[0]
        heads = activation_spec((K,), ("act_kv_heads",), mesh)[0]  # N = G * K splits wherever K does
        qs = jax.P(batch, heads, None)
        pool = jax.P(heads, None, None, None)
        # check_vma=False: the pallas_call carries no varying-manual-axes annotations.
        out_BNH = jax.shard_map(local, mesh=mesh, in_specs=(qs, pool, pool, jax.P(batch), jax.P(batch, None)),
                                out_specs=qs, check_vma=False)(*args)
    return out_BNH[:, None].astype(q_BTNH.dtype)


def paged_attention_gpu(q_BTNH, k_LKPZH, v_LKPZH, page_table_BM, positions_BT, scale, layer,
                        pages_per_block: int = PAGES_PER_BLOCK, max_splits: int = 16, interpret: bool = False):
    """One decode query per slot (T = 1) of layer `layer` through JAX's Pallas GPU paged-attention kernel: one
    launch a layer, each slot reading only its pages up to its position, split over up to `max_splits` parallel
    partitions of its page table, with no page-block loop on the host's side (the XLA path's loop reads its
    trip count back to the host every block).

    The kernel reads pages of one stacked pool per KV head. Slicing layer `layer` out of the pool would copy that
    layer's whole pool every step (see `gather_pages`), so the pool [L, K, P, Z, H] is viewed instead, with no
    copy, as the pages of a single KV head [1, L*K*P, Z, H], and each (slot, KV head) pair is a row of the
    kernel's batch whose page ids are offset to its layer and head.

    JAX marks its Triton-backed Pallas ops deprecated (their successor, tokamax, has no paged kernel yet), so this
    path is opt-in (`decode_kernel="pallas"`) and "auto" keeps the XLA path on GPU until it is measured there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
    B, T, N, H = q_BTNH.shape
    L, K, P, Z, _ = k_LKPZH.shape
    G = N // K
    M = page_table_BM.shape[1]
    R = min(pages_per_block, M)
    splits = min(max_splits, -(-M // R))
    width = -(-M // (R * splits)) * R * splits  # the kernel wants whole compute blocks in every partition
    # Unowned entries (= P) and the padding point at a page of the row's own head; the lengths mask them.
    table_BM = jnp.pad(jnp.clip(page_table_BM, 0, P - 1), ((0, 0), (0, width - M)))
    first_page_K = (layer * K + jnp.arange(K, dtype=table_BM.dtype)) * P
    rows_table = (table_BM[:, None, :] + first_page_K[None, :, None]).reshape(B * K, width)
    rows_q = (q_BTNH[:, 0] * scale).astype(k_LKPZH.dtype).reshape(B * K, G, H)
    rows_len = jnp.repeat((positions_BT[:, 0] + 1).astype(jnp.int32), K)
    one_head = lambda pool: pool.reshape(1, L * K * P, Z, H)  # noqa: E731  (a view: K and P are contiguous)
    out = paged_attention(rows_q, one_head(k_LKPZH), one_head(v_LKPZH), rows_table, rows_len,
                          pages_per_compute_block=R, k_splits=splits, interpret=interpret)
    return out.reshape(B, 1, N, H).astype(q_BTNH.dtype)
