"""Causal self-attention over packed rows, block by block (flash attention's algorithm in plain JAX), for the
paths without a KV cache: training, scoring, prefill.

    blocked_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block) -> out_BTNH

Position t attends to s when s <= t and both are in the same segment (vt.data.packing), exactly the mask
`_xla_attention` is given there. Dense attention materialises fp32 scores and probabilities [B, N, T, T] and
keeps the probabilities for the backward pass: 12.6 MB a layer for the tiny preset's 8 x 256 rows, 2.1 TB for
coder-3b's 4 x 4096 per micro-batch, and on a CPU most of a tiny train step is spent moving them through memory.
Here queries and keys are cut into blocks of `block` positions; the forward pass folds each key block at or
below the diagonal into an online softmax (vt.model.online_softmax, the same fold as decode) and keeps only the
output and the log-sum-exp per query; the backward pass (a custom VJP) recomputes each block's probabilities from
them, as FlashAttention-2 does. Memory is O(T) per row instead of O(T^2), and blocks above the diagonal are never
computed (about half the work of dense attention at long T).

fp32 statistics and accumulators whatever the input dtype; equal to dense attention up to rounding
(tests/model/test_blocked_attention.py). Shape letters as in vt.model.qwen2; J = number of blocks, U = block.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from vt.model import online_softmax

_NEG = jnp.finfo(jnp.float32).min


def _blocks(x_BT_, U: int, pad_value=0):
    """[B, T, ...] -> [J, B, U, ...] (T padded up to J * U with `pad_value`)."""
    B, T = x_BT_.shape[:2]
    J = -(-T // U)
    x = jnp.pad(x_BT_, [(0, 0), (0, J * U - T)] + [(0, 0)] * (x_BT_.ndim - 2), constant_values=pad_value)
    return x.reshape(B, J, U, *x_BT_.shape[2:]).swapaxes(0, 1)


def _unblock(x_JBU_, T: int):
    J, B, U = x_JBU_.shape[:3]
    return x_JBU_.swapaxes(0, 1).reshape(B, J * U, *x_JBU_.shape[3:])[:, :T]


def _visible(seg_q_BU, seg_k_BU, i, j, U: int):
    """[B, U, U] bool: query block i's positions may attend to key block j's (causal within the row, same segment)."""
    causal_UU = (i * U + jnp.arange(U))[:, None] >= (j * U + jnp.arange(U))[None, :]
    return causal_UU[None] & (seg_q_BU[:, :, None] == seg_k_BU[:, None, :])


def _forward(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, U: int):
    B, T, N, H = q_BTNH.shape
    K = k_BTKH.shape[2]
    G = N // K
    scale = H ** -0.5
    q_JBUKGH = _blocks(q_BTNH.reshape(B, T, K, G, H), U)
    k_JBUKH, v_JBUKH = _blocks(k_BTKH, U), _blocks(v_BTKH, U)
    # Padded tail positions get segment -1: no real query ever sees them (they are also above every diagonal).
    seg_JBU = _blocks(segment_ids_BT, U, pad_value=-1)

    def query_block(_, i):
        q_BUKGH, seg_q = q_JBUKGH[i], seg_JBU[i]

        def key_block(j, carry):
            visible = _visible(seg_q, seg_JBU[j], i, j, U)
            return online_softmax.fold_block(carry, q_BUKGH, k_JBUKH[j], v_JBUKH[j], visible, scale, "bskh")

        # Key blocks 0..i: block i holds the diagonal, so every query has seen at least itself at the end.
        m_BKGU, l_BKGU, acc_BKGUH = jax.lax.fori_loop(0, i + 1, key_block, online_softmax.start(B, K, G, U, H))
        out_BUNH = online_softmax.finish((m_BKGU, l_BKGU, acc_BKGUH), q_BTNH.dtype)
        return None, (out_BUNH, m_BKGU + jnp.log(l_BKGU))

    J = q_JBUKGH.shape[0]
    _, (out_JBUNH, lse_JBKGU) = jax.lax.scan(query_block, None, jnp.arange(J))
    return _unblock(out_JBUNH, T), lse_JBKGU


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def blocked_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block: int):
    """Causal, segment-masked attention of q [B, T, N, H] against k, v [B, T, K, H] (N a multiple of K), computed in
    blocks of `block` positions; returns [B, T, N, H] in q's dtype."""
    return _forward(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block)[0]


def _fwd(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block):
    out_BTNH, lse_JBKGU = _forward(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block)
    return out_BTNH, (q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, out_BTNH, lse_JBKGU)


def _bwd(U, res, dout_BTNH):
    """FlashAttention-2's backward pass: per key block j, the query blocks i >= j recompute their probabilities
    P = exp(S - lse) and add dV_j += P^T dO, dK_j += dS^T Q, dQ_i += dS K with dS = P * (dO V^T - delta) * scale,
    delta = rowsum(dO * O). Everything in fp32; the cotangents come back in the inputs' dtypes."""
    q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, out_BTNH, lse_JBKGU = res
    B, T, N, H = q_BTNH.shape
    K = k_BTKH.shape[2]
    G = N // K
    scale = H ** -0.5
    f32 = jnp.float32
    q_JBUKGH = _blocks(q_BTNH.reshape(B, T, K, G, H).astype(f32), U)
    do_JBUKGH = _blocks(dout_BTNH.reshape(B, T, K, G, H).astype(f32), U)
    delta_JBKGU = jnp.einsum("jbukgh,jbukgh->jbkgu", do_JBUKGH,
                             _blocks(out_BTNH.reshape(B, T, K, G, H).astype(f32), U))
    k_JBUKH, v_JBUKH = _blocks(k_BTKH.astype(f32), U), _blocks(v_BTKH.astype(f32), U)
    seg_JBU = _blocks(segment_ids_BT, U, pad_value=-1)
    J = q_JBUKGH.shape[0]

    def key_block(dq_JBUKGH, j):
        k_BUKH, v_BUKH, seg_k = k_JBUKH[j], v_JBUKH[j], seg_JBU[j]

        def query_block(i, carry):
            dq_JBUKGH, dk_BUKH, dv_BUKH = carry
            q_BUKGH, do_BUKGH = q_JBUKGH[i], do_JBUKGH[i]
            s = jnp.einsum("btkgh,bskh->bkgts", q_BUKGH, k_BUKH) * scale
            visible = _visible(seg_JBU[i], seg_k, i, j, U)[:, None, None]
            p = jnp.where(visible, jnp.exp(s - lse_JBKGU[i][..., None]), 0.0)
            dv_BUKH = dv_BUKH + jnp.einsum("bkgts,btkgh->bskh", p, do_BUKGH)
            dp = jnp.einsum("btkgh,bskh->bkgts", do_BUKGH, v_BUKH)
            ds = p * (dp - delta_JBKGU[i][..., None]) * scale
            dk_BUKH = dk_BUKH + jnp.einsum("bkgts,btkgh->bskh", ds, q_BUKGH)
            dq_JBUKGH = dq_JBUKGH.at[i].add(jnp.einsum("bkgts,bskh->btkgh", ds, k_BUKH))
            return dq_JBUKGH, dk_BUKH, dv_BUKH

        zeros = jnp.zeros_like(k_BUKH)
        dq_JBUKGH, dk_BUKH, dv_BUKH = jax.lax.fori_loop(j, J, query_block, (dq_JBUKGH, zeros, zeros))
        return dq_JBUKGH, (dk_BUKH, dv_BUKH)

    dq_JBUKGH, (dk_JBUKH, dv_JBUKH) = jax.lax.scan(key_block, jnp.zeros_like(q_JBUKGH), jnp.arange(J))
    dq_BTNH = _unblock(dq_JBUKGH, T).reshape(B, T, N, H).astype(q_BTNH.dtype)
    return dq_BTNH, _unblock(dk_JBUKH, T).astype(k_BTKH.dtype), _unblock(dv_JBUKH, T).astype(v_BTKH.dtype), None


blocked_attention.defvjp(_fwd, _bwd)
