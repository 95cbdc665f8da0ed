"""The paged KV cache pieces: host page pool (refcounts, sharing, copy-on-write) and device page writes and
decode attention over pages against dense attention (and bench/sampler.py's cost-analysis form against both)."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vt import VtError
from vt.model.attention import dense_attention as _xla_attention
from testutil import REPO
from vt.model.kv_pages import copy_pages, paged_attention_gpu, paged_attention_xla, write_pages
from vt.sampling.page_table import PagePool, PageTables, pool_pages, prompt_need, prompt_pages

sys.path.insert(0, str(REPO / "bench"))
from sampler import cost_analysis_cache  # noqa: E402  (bench/sampler.py --roofline's form of the cache)

CostAnalysisKVCache = cost_analysis_cache()


def test_pool_refcounts_share_and_copy_on_write():
    pool = PagePool(10)
    own, per_sample, copies = prompt_pages(pool, prompt_len=9, n_samples=3, page_size=4)  # 2 full + 1 partial
    assert own == [0, 1, 2] and pool.in_use == 3 + 2 == prompt_need(9, 3, 4)
    assert per_sample == [[0, 1, 3], [0, 1, 4], [0, 1, 2]] and copies == [(2, 3), (2, 4)]
    assert pool.refs[:5].tolist() == [3, 3, 1, 1, 1]
    tables = PageTables(pool, batch=3, max_pages=4, page_size=4)
    for b, pages in enumerate(per_sample):
        tables.assign(b, pages)
    tables.grow(0, 13)  # a fourth page for slot 0
    assert tables.pages[0] == [0, 1, 3, 5] and tables.table[0].tolist() == [0, 1, 3, 5]
    assert tables.missing(1, 13) == 1 and tables.missing(1, 100) == 1  # capped at max_pages
    tables.free(0)
    assert pool.refs[:6].tolist() == [2, 2, 1, 0, 1, 0] and tables.table[0].tolist() == [10] * 4
    tables.free(1)
    tables.free(2)
    assert pool.in_use == 0 and pool.peak_in_use == 6
    assert pool.alloc(2) == [0, 1]  # lowest ids first: deterministic
    with pytest.raises(VtError, match="8 free"):
        pool.alloc(9)
    assert prompt_pages(PagePool(4), 8, 3, 4)[2] == []  # no partial page: nothing to copy


def test_pool_size_from_config():
    assert pool_pages(7, 0.5, 100, 1000, None) == 7
    assert pool_pages(0, 0.5, 100, 1000, None) == 1000  # no memory statistics: the worst case
    assert pool_pages(0, 0.5, 100, 1000, 30_000) == 150
    assert pool_pages(0, 0.5, 100, 1000, 10**9) == 1000


def _scatter_to_pages(k_BSKH, Z, P, seed):
    """A random page assignment of a dense [B, S, K, H] cache: (pool [K, P, Z, H], table [B, S // Z])."""
    B, S, K, H = k_BSKH.shape
    M = S // Z
    perm = np.random.default_rng(seed).permutation(P)[:B * M].reshape(B, M)
    pool = np.zeros((K, P, Z, H), np.float32)
    for b in range(B):
        for m in range(M):
            pool[:, perm[b, m]] = np.asarray(k_BSKH[b, m * Z:(m + 1) * Z]).transpose(1, 0, 2)
    return jnp.asarray(pool), jnp.asarray(perm, jnp.int32)


@pytest.mark.parametrize("B,T,N,K,H,Z,M,R", [(3, 1, 6, 2, 16, 4, 12, 2), (2, 3, 4, 4, 8, 8, 5, 2),
                                             (4, 1, 8, 2, 32, 16, 6, 8), (2, 1, 4, 1, 8, 4, 7, 3)])
def test_paged_attention_equals_dense(B, T, N, K, H, Z, M, R):
    """Pages in a shuffled order, GQA (N > K), queries straddling page and block boundaries: equal to dense
    attention over the slot's positions. fp32, 1e-6 absolute."""
    S = Z * M
    rng = np.random.default_rng(S + T + N)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((B, T, N, H), (B, S, K, H), (B, S, K, H)))
    P = B * M + 5
    kp, table = _scatter_to_pages(k, Z, P, seed=1)
    vp, _ = _scatter_to_pages(v, Z, P, seed=1)
    start = rng.integers(0, S - T, size=B)
    start[0] = Z - 1  # first query the last slot of a page
    pos = jnp.asarray(start[:, None] + np.arange(T)[None], jnp.int32)
    dense = _xla_attention(q, k, v, jnp.arange(S)[None, None, :] <= pos[:, :, None], H ** -0.5)
    f = jax.jit(paged_attention_xla, static_argnums=(5, 6))
    np.testing.assert_allclose(np.asarray(f(q, kp, vp, table, pos, H ** -0.5, R)), np.asarray(dense),
                               atol=1e-6, rtol=0)
    stacked = lambda pool: jnp.stack([jnp.zeros_like(pool), pool])  # noqa: E731  (layer 1 of a stacked pool)
    np.testing.assert_allclose(np.asarray(jax.jit(paged_attention_xla, static_argnums=(5, 6, 7))(
        q, stacked(kp), stacked(vp), table, pos, H ** -0.5, R, 1)), np.asarray(dense), atol=1e-6, rtol=0)
    if R == 8:  # the cost-analysis form (every page block unrolled, as the roofline measures it) agrees
        form = CostAnalysisKVCache(k=stacked(kp), v=stacked(vp), page_table=table)
        np.testing.assert_allclose(np.asarray(jax.jit(form.attend, static_argnums=(0, 6))(
            1, q, None, None, pos, None, "xla")), np.asarray(dense), atol=1e-6, rtol=0)


def test_write_pages_and_copy_on_write():
    L, K, P, Z, H = 2, 2, 6, 4, 3
    pool = jnp.zeros((L, K, P, Z, H))
    table = jnp.asarray([[2, 5, P], [0, P, P]], jnp.int32)
    pos = jnp.asarray([[3, 4, 5], [1, 2, 9]], jnp.int32)  # (1, 9): an unowned page, dropped
    new = jnp.arange(2 * 3 * K * H, dtype=jnp.float32).reshape(2, 3, K, H) + 1
    out = np.asarray(write_pages(pool, 1, new, pos, table))
    want = np.zeros((L, K, P, Z, H), np.float32)
    for b, t, page, off in [(0, 0, 2, 3), (0, 1, 5, 0), (0, 2, 5, 1), (1, 0, 0, 1), (1, 1, 0, 2)]:
        want[1, :, page, off] = np.asarray(new[b, t])
    np.testing.assert_array_equal(out, want)
    pos1, new1 = jnp.asarray([[3], [1]], jnp.int32), new[:, :1]  # single-token steps: the per-slot writes of
    form = CostAnalysisKVCache(k=pool, v=pool, page_table=table).write(1, new1, new1, pos1)  # the cost form agree
    np.testing.assert_array_equal(np.asarray(form.k), np.asarray(write_pages(pool, 1, new1, pos1, table)))
    copied = np.asarray(copy_pages(jnp.asarray(out), jnp.asarray([5, 0]), jnp.asarray([3, P])))
    want[:, :, 3] = want[:, :, 5]
    np.testing.assert_array_equal(copied, want)


def test_decode_step_does_not_copy_a_layers_page_pool():
    """Decode attention gathers each block's pages straight from the stacked pool, (layer, page) in one index. Slicing
    the layer out first made XLA copy that layer's whole pool out of the scan's carry, every layer of every step:
    on an H200 the copy took 13% of coder-3b's decode step, and its buffer grows with the pool, which the engine
    sizes to fill free memory. The compiled decode program's temp memory shows the copy on CPU too: here it must
    not grow with the pool (it grew by exactly one layer's K + V pool with the slice)."""
    from functools import partial

    from flax import nnx

    from vt.model.config import preset
    from vt.model.kv_pages import PagedKVCache
    from vt.model.qwen2 import abstract_model
    from vt.sampling import steps
    from vt.sampling.rules import SamplingParams
    from vt.sharding import abstract_of

    B, M, Z = 8, 16, 16
    mc = preset("tiny", num_layers=2)
    graphdef, state = nnx.split(abstract_model(mc))
    slots = abstract_of(steps.Slots.abstract(B))
    decode = partial(steps.decode, graphdef, params=SamplingParams(1.0), stop_ids=(), steps_per_call=4)

    def temp_bytes(n_pages):
        cache = abstract_of(PagedKVCache.abstract(mc, n_pages, Z, PagedKVCache.table_info(B, M)))
        compiled = jax.jit(decode, donate_argnums=(1, 2)).lower(state, cache, slots, 4, 1).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = B * M + 1, 16 * B * M + 1
    one_layer_growth = 2 * mc.num_kv_heads * (large - small) * Z * mc.head_dim * jnp.dtype(mc.dtype).itemsize
    assert temp_bytes(large) - temp_bytes(small) < one_layer_growth / 16


@pytest.mark.parametrize("B,N,K,H,Z,M,L,splits", [(3, 8, 2, 16, 4, 12, 3, 16), (2, 6, 2, 8, 8, 5, 2, 16),
                                                  (4, 4, 1, 32, 16, 7, 1, 16), (2, 14, 2, 64, 16, 40, 2, 4)])
def test_the_gpu_kernel_path_equals_the_xla_path(B, N, K, H, Z, M, L, splits):
    """JAX's Pallas GPU paged-attention kernel (run by Pallas's interpreter here) over the stacked pool viewed as
    one KV head's pages, (slot, head) rows offset to their layer and head: equal to the XLA path for every layer,
    with unowned table entries, tables that are no whole number of partitions (padded), GQA up to 7 query heads
    per KV head, and slots from position 0 to the table's last. fp32, 1e-6 absolute."""
    rng = np.random.default_rng(B * M + L)
    P = B * M + 3
    q = jnp.asarray(rng.normal(size=(B, 1, N, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(L, K, P, Z, H)), jnp.float32) for _ in range(2))
    pos = rng.integers(0, M * Z, size=B)
    pos[0], pos[-1] = 0, M * Z - 1
    table = np.full((B, M), P, np.int32)  # unowned past each slot's position
    perm = rng.permutation(P)
    for b in range(B):
        table[b, :pos[b] // Z + 1] = perm[b * M:b * M + pos[b] // Z + 1]
    table, pos = jnp.asarray(table), jnp.asarray(pos[:, None], jnp.int32)
    for layer in range(L):
        got = paged_attention_gpu(q, k, v, table, pos, H ** -0.5, jnp.int32(layer), max_splits=splits,
                                  interpret=True)
        want = paged_attention_xla(q, k, v, table, pos, H ** -0.5, layer=jnp.int32(layer))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)
