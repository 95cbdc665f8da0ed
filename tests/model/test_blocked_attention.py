"""Blocked self-attention (vt.model.blocked_attention) against the dense reference `dense_attention` and against
transformers.

Tolerances (max-abs difference), stated once: float32 outputs and gradients 1e-5 (the parity tolerance of
tests/model/test_parity.py); bfloat16 inputs: the blocked result's error against the float32 reference at most
that of dense attention run in bfloat16 on the same inputs, plus one bfloat16 ulp of the output's scale.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import vt.model.attention as attention
from vt.checkpoint.params import load_model
from vt.model.blocked_attention import blocked_attention
from vt.model.attention import dense_attention as _xla_attention

FP32_TOL = 1e-5


def _inputs(B, T, N, K, H, seed, dtype=jnp.float32, segments=3):
    rng = np.random.default_rng(seed)
    q, k, v, w = (jnp.asarray(rng.normal(size=s), dtype) for s in
                  ((B, T, N, H), (B, T, K, H), (B, T, K, H), (B, T, N, H)))
    # Packed rows: sorted document ids, segment 0 (padding) included, documents crossing block boundaries.
    seg = np.sort(rng.integers(0, segments + 1, (B, T)), axis=1).astype(np.int32)
    return q, k, v, w.astype(jnp.float32), jnp.asarray(seg)


def _dense(q, k, v, seg):
    T = q.shape[1]
    mask = jnp.tril(jnp.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :])
    return _xla_attention(q, k, v, mask, q.shape[-1] ** -0.5)


def _outputs_and_grads(f, q, k, v, w):
    """f(q, k, v) and the gradient of sum(f * w), as one compiled program (tracing the blocked loops op by op
    costs about three times as much on CPU)."""
    def run(q, k, v):
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(w)
    return jax.jit(run)(q, k, v)


@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 150), heads=st.sampled_from([(4, 4), (6, 2), (4, 1)]),
       H=st.sampled_from([8, 16]), block=st.sampled_from([4, 16, 32, 64]), seed=st.integers(0, 2 ** 16))
def test_outputs_and_gradients_equal_dense_attention(B, T, heads, H, block, seed):
    N, K = heads
    q, k, v, w, seg = _inputs(B, T, N, K, H, seed)
    got, want = (_outputs_and_grads(f, q, k, v, w) for f in
                 (lambda q, k, v: blocked_attention(q, k, v, seg, block), lambda q, k, v: _dense(q, k, v, seg)))
    np.testing.assert_allclose(got[0], want[0], atol=FP32_TOL, rtol=0)
    for g, h in zip(got[1], want[1]):
        np.testing.assert_allclose(g, h, atol=FP32_TOL, rtol=0)


def test_bfloat16_error_no_worse_than_dense_bfloat16():
    q, k, v, w, seg = _inputs(2, 200, 6, 2, 16, seed=1, dtype=jnp.bfloat16)
    ref = _dense(*(x.astype(jnp.float32) for x in (q, k, v)), seg)
    blocked = blocked_attention(q, k, v, seg, 32)
    assert blocked.dtype == jnp.bfloat16
    err_blocked = float(jnp.abs(blocked.astype(jnp.float32) - ref).max())
    err_dense = float(jnp.abs(_dense(q, k, v, seg).astype(jnp.float32) - ref).max())
    ulp = float(jnp.abs(ref).max()) * 2.0 ** -8
    assert err_blocked <= err_dense + ulp, (err_blocked, err_dense)
    dq, dk, dv = jax.grad(lambda q, k, v: (blocked_attention(q, k, v, seg, 32).astype(jnp.float32) * w).sum(),
                          (0, 1, 2))(q, k, v)
    assert dq.dtype == dk.dtype == dv.dtype == jnp.bfloat16


def test_no_quadratic_temporaries_in_the_gradient():
    """The compiled gradient keeps O(T) per row: its temporaries stay far below one layer's dense fp32 scores."""
    B, T, N, K, H = 2, 2048, 4, 2, 16
    sds = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    args = (sds(B, T, N, H), sds(B, T, K, H), sds(B, T, K, H), jax.ShapeDtypeStruct((B, T), jnp.int32))
    grad = jax.jit(jax.grad(lambda q, k, v, s: blocked_attention(q, k, v, s, 64).sum(), (0, 1, 2)))
    temp = grad.lower(*args).compile().memory_analysis().temp_size_in_bytes
    scores = B * N * T * T * 4
    assert temp < scores / 8, (temp, scores)


def test_model_uses_blocks_on_long_rows_and_matches_transformers(hf_dir, vt_ckpt, monkeypatch):
    """Rows of 2+ blocks go through blocked attention in the model; logits equal transformers' (right-padded
    rows of different lengths) and equal the dense path's, packed documents included."""
    from transformers import AutoModelForCausalLM
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    model = load_model(vt_ckpt)
    rng = np.random.RandomState(0)
    lengths = [150, 131, 64, 1]
    T = max(lengths)
    assert T >= 2 * attention.ATTENTION_BLOCK
    mask = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    tokens = np.where(mask, rng.randint(0, hf_model.config.vocab_size, (len(lengths), T)), 0)
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64))).logits.numpy()
    calls = []
    real = attention.blocked_attention
    monkeypatch.setattr(attention, "blocked_attention", lambda *a: calls.append(1) or real(*a))
    ours, _ = model(jnp.asarray(tokens, jnp.int32), segment_ids_BT=jnp.asarray(mask, jnp.int32))
    assert calls, "the long rows did not go through blocked attention"
    assert np.abs(np.asarray(ours) - ref)[mask].max() < FP32_TOL

    # packed documents crossing block boundaries: blocked == dense (ATTENTION_BLOCK raised past the row length)
    seg = np.array([[1] * 70 + [2] * 90 + [3] * 20 + [0] * 20])
    pos = np.concatenate([np.arange(70), np.arange(90), np.arange(20), np.zeros(20, int)])[None]
    packed = rng.randint(0, 300, seg.shape)
    args = (jnp.asarray(packed), jnp.asarray(pos), jnp.asarray(seg))
    blocked, _ = model(*args)
    monkeypatch.setattr(attention, "ATTENTION_BLOCK", 10 ** 6)
    dense, _ = model(*args)
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(dense), atol=FP32_TOL, rtol=0)


@pytest.mark.devices(8)
def test_sharded_model_gradients_equal_dense(vt_ckpt):
    """On the (data 2, fsdp 2, tensor 2) mesh the loss gradients through blocked attention equal the dense path's
    on one device."""
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    import vt.model.attention as attention
    from vt.checkpoint.params import load_model
    from vt.sharding import MeshConfig, make_mesh, use_mesh
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(0, 300, (4, 160)), jnp.int32)
    seg = jnp.asarray(np.sort(rng.randint(1, 4, (4, 160)), axis=1), jnp.int32)

    def loss(state, graphdef, tokens, seg):
        logits = nnx.merge(graphdef, state)(tokens, segment_ids_BT=seg)[0]
        return jax.nn.log_softmax(logits).mean()

    def grads(model):
        graphdef, state = nnx.split(model)
        return jax.jit(jax.grad(loss), static_argnums=1)(state, graphdef, tokens, seg)

    with use_mesh(mesh):
        sharded = grads(load_model(vt_ckpt, mesh=mesh))
    attention.ATTENTION_BLOCK = 10 ** 6
    dense = grads(load_model(vt_ckpt))
    worst = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(dense)))
    assert worst < FP32_TOL, worst
    print(worst)


def test_block_grows_with_the_row(vt_ckpt_qwen2, monkeypatch):
    """Rows of 256 positions or more run in blocks of 128, from 1,024 in blocks of 256 (attention_block); the
    model's output over packed documents crossing those blocks equals the dense path's."""
    assert [attention.attention_block(T) for T in (128, 255, 256, 1023, 1024, 4096)] == [64, 64, 128, 128, 256, 256]
    model = load_model(vt_ckpt_qwen2)
    rng = np.random.RandomState(1)
    seg = np.array([[1] * 100 + [2] * 170 + [3] * 20 + [0] * 10])
    pos = np.concatenate([np.arange(100), np.arange(170), np.arange(20), np.zeros(10, int)])[None]
    args = (jnp.asarray(rng.randint(0, 300, seg.shape)), jnp.asarray(pos), jnp.asarray(seg))
    blocks = []
    real = attention.blocked_attention
    monkeypatch.setattr(attention, "blocked_attention", lambda *a: blocks.append(a[4]) or real(*a))
    blocked, _ = model(*args)
    assert set(blocks) == {128}, blocks
    monkeypatch.setattr(attention, "ATTENTION_BLOCK", 10 ** 6)
    dense, _ = model(*args)
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(dense), atol=FP32_TOL, rtol=0)
