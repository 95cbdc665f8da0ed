"""Splash attention (Pallas TPU kernel, here in interpret mode on CPU) and "auto" against vt's XLA attention.

Tolerances, max-abs difference between splash and `_xla_attention` on the same inputs:
  float32: 1e-5 absolute for outputs and for gradients w.r.t. q, k, v (measured: outputs up to 1.3e-6,
           gradients up to 3.3e-6 at magnitudes up to ~7.5). Where values grow with the sum over many terms
           (whole-model logits up to ~9.4, d(sum)/dk) the bound is 1e-5 relative to the largest reference value;
           the whole model's logits differ by 1.7e-5, and the XLA model alone by 2.1e-5 between eager and jit.
  bfloat16: 2e-2 x the largest reference magnitude (measured one bf16 ulp, 0.0156 at magnitudes 2-4, i.e.
           <= 0.63% of the largest value, on outputs and gradients); the two paths round q*scale, the
           probabilities and the output at different points, so an ulp or two apart is expected.
Padding: every position is compared, segment 0 included. Padding tokens form a segment of their own, and under
the causal & same-segment mask each token sees at least itself, so no row is fully masked and both paths give
the same finite softmax there. (Only a fully masked row could differ: vt's XLA path keeps it finite on purpose,
while the splash kernel documents an all-masked row as an invalid softmax. vt's no-cache path cannot make one.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vt import VtError
from vt.model.config import preset
from vt.model.attention import dense_attention as _xla_attention
from vt.model.attention import resolve
from vt.model.qwen2 import create_model
from vt.model.splash import block_size, splash_attention

FP32_ATOL = 1e-5
BF16_REL = 2e-2


def _segments(B, T):
    """Row 0: three documents and trailing padding (segment 0); other rows: two documents, no padding."""
    seg = np.zeros((B, T), np.int32)
    a, b = T // 3, T // 4
    seg[0] = np.repeat([1, 2, 3, 0], [a, b, T - a - b - 10, 10])
    seg[1:] = np.repeat([1, 2], [T // 2, T - T // 2])
    return jnp.asarray(seg)


def _mask(seg_BT):
    T = seg_BT.shape[1]
    return jnp.tril(jnp.ones((T, T), bool))[None] & (seg_BT[:, :, None] == seg_BT[:, None, :])


def _close(got, want, dtype):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    err = np.abs(got - want).max()
    tol = FP32_ATOL if dtype == jnp.float32 else BF16_REL * np.abs(want).max()
    assert err <= tol, (err, tol)


# (B, T, N, K, H): GQA with 2 query heads per kv head at T = 256 (two 128-blocks); tiny's head layout (6 / 2,
# H 16) at T = 200, which splash pads to 256; and plain MHA with H 128 in one block.
SHAPES = [(2, 256, 4, 2, 64), (2, 200, 6, 2, 16), (2, 128, 4, 4, 128)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}N{}K{}H{}".format(*s))
def test_splash_matches_xla_outputs_and_grads(shape, dtype):
    B, T, N, K, H = shape
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=s), dtype) for s in [(B, T, N, H), (B, T, K, H), (B, T, K, H)])
    cotangent = jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32)
    seg = _segments(B, T)
    splash = lambda q, k, v: splash_attention(q, k, v, seg, interpret=True)  # noqa: E731
    xla = lambda q, k, v: _xla_attention(q, k, v, _mask(seg), H ** -0.5)  # noqa: E731

    _close(jax.jit(splash)(q, k, v), xla(q, k, v), dtype)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * cotangent)
    got = jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(xla), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        _close(g, w, dtype)


def test_block_sizes_fit_the_sequence():
    assert [block_size(t) for t in (128, 256, 384, 512, 768, 4096)] == [128, 256, 128, 512, 256, 512]
    with pytest.raises(VtError, match="multiple of 128"):
        block_size(200)


def _tiny(impl, name="tiny", **kw):
    # initializer_range 0.2 (not 0.02) so attention is far from uniform and a wrong mask shows in the logits.
    return create_model(preset(name, attention_impl=impl, initializer_range=0.2, **kw), seed=3)


def _packed_batch(T=160):
    """Two rows of packed documents with positions restarting per document; row 0 ends in padding."""
    rng = np.random.RandomState(0)
    seg = np.asarray(_segments(2, T))
    pos = np.zeros_like(seg)
    for b in range(2):
        for s in np.unique(seg[b]):
            idx = np.flatnonzero(seg[b] == s)
            pos[b, idx] = np.arange(len(idx))
    return (jnp.asarray(rng.randint(0, 512, (2, T)), jnp.int32), jnp.asarray(pos, jnp.int32),
            jnp.asarray(seg, jnp.int32))


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_tiny_model_splash_matches_xla_logits_and_param_grads(name):
    """Whole model (Qwen2- and Qwen3-shaped), T = 160 (padded to 256 inside splash). Gradients w.r.t. every
    parameter agree as well, with splash under remat_policy="full" (the kernel's custom VJP recomputed inside
    jax.checkpoint)."""
    from flax import nnx
    tokens, pos, seg = _packed_batch()
    ref, model = _tiny("xla", name), _tiny("splash", name, remat_policy="full")
    forward = jax.jit(lambda m, *a: m(*a)[0])
    want = np.asarray(forward(ref, tokens, pos, seg))
    got = np.asarray(forward(model, tokens, pos, seg))
    # Logits reach ~9 with these weights, and fp32 round-off grows with them: the XLA model alone differs from
    # itself by 2.1e-5 between eager and jit. So the bound is FP32_ATOL relative to the largest logit (9.4e-5;
    # splash vs xla measured 1.7e-5).
    scale = np.abs(want).max()
    assert scale > 1.0  # the logits are not all near zero
    np.testing.assert_allclose(got, want, atol=FP32_ATOL * scale, rtol=0)

    weights = jnp.asarray(np.random.RandomState(1).normal(size=want.shape), jnp.float32)

    def grads(m):
        return nnx.grad(lambda m: jnp.sum(m(tokens, pos, seg)[0] * weights))(m)
    g_ref = nnx.to_flat_state(jax.jit(grads)(ref))
    g_got = nnx.to_flat_state(jax.jit(grads)(model))
    for (path, a), (_, b) in zip(g_ref, g_got):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        # gradients are sums over 320 tokens x 512 logits: 1e-5 relative to the largest entry of each tensor
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max()), path


def test_splash_model_decodes_with_kv_cache_through_xla():
    """Attention over KV pages is the cache's own (XLA) whatever the setting: a chunk then decode steps through a
    fixed page table equal a full splash forward."""
    from vt.model.kv_pages import PagedKVCache
    model = _tiny("splash")
    seq = jnp.asarray(np.random.RandomState(4).randint(0, 512, (2, 10)), jnp.int32)
    full = np.asarray(jax.jit(lambda m, t: m(t)[0])(model, seq))
    atol = FP32_ATOL * np.abs(full).max()  # relative to the logit scale, as in the test above
    cache = PagedKVCache.for_rows(model.cfg, batch=2, length=16, page_size=4)
    logits, cache = model(seq[:, :6], cache=cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, :6], atol=atol, rtol=0)
    for t in range(6, 10):
        logits, cache = model(seq[:, t:t + 1], positions_BT=jnp.full((2, 1), t, jnp.int32), cache=cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), full[:, t], atol=atol, rtol=0)


def test_auto_resolves_to_xla_on_cpu():
    assert jax.default_backend() == "cpu"
    for dtype in (jnp.float32, jnp.bfloat16):
        assert resolve("auto", dtype) == "xla"
        assert resolve("jax", dtype) == "jax"  # cuDNN only on NVIDIA GPUs
    assert resolve("splash", jnp.float32) == "splash"
    assert _tiny("auto").layers.attn.impl == "xla"  # resolved once, when the model is built
    tokens, pos, seg = _packed_batch(T=24)
    np.testing.assert_array_equal(np.asarray(_tiny("auto")(tokens, pos, seg)[0]),
                                  np.asarray(_tiny("xla")(tokens, pos, seg)[0]))
    for gone in ("flash", "cudnn"):  # "cudnn" is what "jax" runs as on NVIDIA GPUs
        with pytest.raises(VtError, match="attention_impl"):
            preset("tiny", attention_impl=gone)


@pytest.mark.devices(8)
def test_splash_under_mesh_runs_per_shard():
    """8 simulated devices. (data 2, fsdp 2, tensor 2): batch over data x fsdp, heads over tensor, and the
    compiled forward and backward contain no collective at all (the kernel runs on each shard's own heads).
    (data 2, tensor 4) with 8 query / 2 kv heads: kv heads do not divide over tensor, so they are repeated per
    query head; still equal to XLA. Last, the tiny model created sharded on the first mesh gives the logits of
    the single-device XLA model."""
    import jax, jax.numpy as jnp, numpy as np
    from vt.model.config import preset
    from vt.model.attention import dense_attention as _xla_attention
    from vt.model.qwen2 import create_model
    from vt.model.splash import splash_attention
    from vt.sharding import MeshConfig, make_mesh, use_mesh
    assert len(jax.devices()) == 8
    T = 128
    seg_row = np.repeat([1, 2, 0], [50, 70, 8])
    for mesh_cfg, (B, N, K, H), no_collectives in [(MeshConfig(data=2, fsdp=2, tensor=2), (4, 4, 2, 64), True),
                                                   (MeshConfig(data=2, fsdp=1, tensor=4), (2, 8, 2, 64), False)]:
        mesh = make_mesh(mesh_cfg)
        rng = np.random.default_rng(0)
        q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(B, T, N, H), (B, T, K, H), (B, T, K, H)])
        seg = jnp.asarray(np.tile(seg_row, (B, 1)), jnp.int32)
        mask = jnp.tril(jnp.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :])
        want = _xla_attention(q, k, v, mask, H ** -0.5)
        want_g = jax.grad(lambda q, k, v: _xla_attention(q, k, v, mask, H ** -0.5).sum(),
                          argnums=(0, 1, 2))(q, k, v)
        put = lambda x, spec: jax.device_put(x, jax.NamedSharding(mesh, jax.P(*spec)))
        kv_spec = (("data", "fsdp"), None, "tensor" if K % mesh.shape["tensor"] == 0 else None)
        qs, ks, vs = put(q, (("data", "fsdp"), None, "tensor")), put(k, kv_spec), put(v, kv_spec)
        segs = put(seg, (("data", "fsdp"),))
        with use_mesh(mesh):
            fwd = jax.jit(lambda q, k, v, s: splash_attention(q, k, v, s, interpret=True))
            bwd = jax.jit(jax.grad(lambda q, k, v, s: splash_attention(q, k, v, s, interpret=True).sum(),
                                   argnums=(0, 1, 2)))
            got, got_g = fwd(qs, ks, vs, segs), bwd(qs, ks, vs, segs)
            hlo = fwd.lower(qs, ks, vs, segs).compile().as_text() + bwd.lower(qs, ks, vs, segs).compile().as_text()
        assert got.sharding.spec[2] == "tensor", got.sharding
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=FP32_ATOL, rtol=0)
        for a, b in zip(got_g, want_g):
            # d(sum)/dk and dv add up over all the queries of a group (entries reach ~20): relative bound
            scale = max(1.0, float(np.abs(np.asarray(b)).max()))
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=FP32_ATOL * scale, rtol=0)
        print(mesh_cfg, "max abs diff", np.abs(np.asarray(got) - np.asarray(want)).max(),
              [(float(np.abs(np.asarray(a) - np.asarray(b)).max()), float(np.abs(np.asarray(b)).max()))
               for a, b in zip(got_g, want_g)])
        if no_collectives:
            for op in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter", "collective-permute"):
                assert op not in hlo, op

    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    cfg = preset("tiny", initializer_range=0.2)
    ref = create_model(cfg, seed=3)
    sharded = create_model(cfg.replace(attention_impl="splash"), mesh=mesh, seed=3)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 512, (4, T)), jnp.int32)
    seg = jnp.asarray(np.tile(seg_row, (4, 1)), jnp.int32)
    forward = jax.jit(lambda m, t, s: m(t, None, s)[0])
    want = np.asarray(forward(ref, tokens, seg))
    with use_mesh(mesh):
        got = np.asarray(forward(sharded, tokens, seg))
    err = np.abs(got - want).max()
    assert err <= FP32_ATOL * np.abs(want).max(), err  # relative to the logit scale, as on one device
    print("model logits max abs diff", err, "max logit", np.abs(want).max())
