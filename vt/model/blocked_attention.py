"""Causal self-attention over packed rows, block by block (flash attention's algorithm in plain JAX), for the
paths without a KV cache: training, scoring, prefill.

    blocked_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block, branches=False) -> out_BTNH

Position t attends to s when s <= t and their segments are visible (vt.model.segments: the same segment, or with
`branches` the prefix document of a branch), exactly the mask `dense_attention` is given there. Dense attention
materialises fp32 scores and probabilities [B, N, T, T] and keeps the probabilities for the backward pass: 12.6 MB
a layer for the tiny preset's 8 x 256 rows, 2.1 TB for coder-3b's 4 x 4096 per micro-batch, and on a CPU most of a
tiny train step is spent moving them through memory. Here queries and keys are cut into blocks of `block`
positions; the forward pass folds each key block at or below the diagonal into an online softmax
(vt.model.online_softmax, the same fold as decode) and keeps only the output and the log-sum-exp per query; the
backward pass (a custom VJP) recomputes each block's probabilities from them, as FlashAttention-2 does. Memory is
O(T) per row instead of O(T^2), and blocks above the diagonal are never computed (about half the work of dense
attention at long T).

fp32 statistics and accumulators whatever the input dtype; equal to dense attention up to rounding
(tests/model/test_blocked_attention.py). Blocks are laid out heads first (`_head_blocks`). Shape letters as in
vt.model.qwen2; J = number of blocks, U = block.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from vt.model import online_softmax, segments

# checkpoint_name()s of the forward pass's residuals: the output blocks and the log-sum-exp per query.
ATTENTION_OUT, ATTENTION_LSE = "attention_out", "attention_lse"


def _blocks(x_BT, U: int, pad_value=0):
    """[B, T] -> [J, B, U] (T padded up to J * U with `pad_value`)."""
    B, T = x_BT.shape
    J = -(-T // U)
    return jnp.pad(x_BT, ((0, 0), (0, J * U - T)), constant_values=pad_value).reshape(B, J, U).swapaxes(0, 1)


def _head_blocks(x_BT_H, U: int):
    """[B, T, *heads, H] -> [J, B, *heads, U, H], heads first (T padded with zeros up to J * U): the layout of the
    scores [B, K, G, U, U], so no matmul inside the block loops needs a transpose. Done once per call; on a
    2-core CPU it made the tiny preset's attention (8 x 256 rows) forward and backward ~25% faster than
    position-first blocks [J, B, U, *heads, H] transposed in every block pair."""
    B, T = x_BT_H.shape[:2]
    J = -(-T // U)
    x = jnp.pad(x_BT_H, [(0, 0), (0, J * U - T)] + [(0, 0)] * (x_BT_H.ndim - 2))
    x = x.reshape(B, J, U, *x_BT_H.shape[2:])
    return jnp.moveaxis(x, (1, 2), (0, -2))


def _unhead_blocks(x_JB_UH, T: int):
    """[J, B, *heads, U, H] -> [B, T, *heads, H]: `_head_blocks` undone, padding cut off."""
    J, B, U = x_JB_UH.shape[0], x_JB_UH.shape[1], x_JB_UH.shape[-2]
    x = jnp.moveaxis(x_JB_UH, (0, -2), (1, 2))
    return x.reshape(B, J * U, *x.shape[3:])[:, :T]


def _visible(seg_q_BU, pre_q_BU, seg_k_BU, i, j, U: int, branches: bool):
    """[B, U, U] bool: query block i's positions may attend to key block j's (causal within the row, visible
    segments: vt.model.segments)."""
    causal_UU = (i * U + jnp.arange(U))[:, None] >= (j * U + jnp.arange(U))[None, :]
    return causal_UU[None] & segments.visible(seg_q_BU[:, :, None], seg_k_BU[:, None, :], pre_q_BU[:, :, None],
                                              branches=branches)


def _forward(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, U: int, branches: bool):
    """(out in blocks [J, B, K, G, U, H] in q's dtype, log-sum-exp [J, B, K, G, U])."""
    B, T, N, H = q_BTNH.shape
    K = k_BTKH.shape[2]
    G = N // K
    scale = H ** -0.5
    q_JBKGUH = _head_blocks(q_BTNH.reshape(B, T, K, G, H), U)
    k_JBKUH, v_JBKUH = _head_blocks(k_BTKH, U), _head_blocks(v_BTKH, U)
    # Padded tail positions get segment -1: no real query ever sees them (they are also above every diagonal).
    seg_JBU = _blocks(segment_ids_BT, U, pad_value=-1)
    pre_JBU = segments.prefix(seg_JBU) if branches else seg_JBU  # read only with branches

    def query_block(_, i):
        q_BKGUH, seg_q, pre_q = q_JBKGUH[i], seg_JBU[i], pre_JBU[i]

        def key_block(j, carry):
            visible = _visible(seg_q, pre_q, seg_JBU[j], i, j, U, branches)
            return online_softmax.fold_block(carry, q_BKGUH, k_JBKUH[j], v_JBKUH[j], visible, scale, "bksh", "bkgth")

        # Key blocks 0..i: block i holds the diagonal, so every query has seen at least itself at the end.
        carry = jax.lax.fori_loop(0, i + 1, key_block, online_softmax.start(B, K, G, U, H))
        m_BKGU, l_BKGU, _ = carry
        return None, (online_softmax.normalized(carry).astype(q_BTNH.dtype), m_BKGU + jnp.log(l_BKGU))

    J = q_JBKGUH.shape[0]
    _, (out_JBKGUH, lse_JBKGU) = jax.lax.scan(query_block, None, jnp.arange(J))
    return out_JBKGUH, lse_JBKGU


def _output(out_JBKGUH, q_BTNH):
    """The output blocks as [B, T, N, H], q's shape."""
    return _unhead_blocks(out_JBKGUH, q_BTNH.shape[1]).reshape(q_BTNH.shape)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def blocked_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block: int, branches: bool = False):
    """Causal, segment-masked attention of q [B, T, N, H] against k, v [B, T, K, H] (N a multiple of K), computed in
    blocks of `block` positions (with `branches`, a branch segment also sees its prefix document:
    vt.model.segments); returns [B, T, N, H] in q's dtype."""
    return _output(_forward(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block, branches)[0], q_BTNH)


def _fwd(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block, branches):
    out_JBKGUH, lse_JBKGU = _forward(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, block, branches)
    # Named for the "save_attention" remat policy (vt.model.qwen2). The output is made from the named blocks: with
    # both saved, the rematerialised layer needs nothing from the block loops and skips them.
    out_JBKGUH = checkpoint_name(out_JBKGUH, ATTENTION_OUT)
    lse_JBKGU = checkpoint_name(lse_JBKGU, ATTENTION_LSE)
    return _output(out_JBKGUH, q_BTNH), (q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, out_JBKGUH, lse_JBKGU)


def _bwd(U, branches, res, dout_BTNH):
    """FlashAttention-2's backward pass: per key block j, the query blocks i >= j recompute their probabilities
    P = exp(S - lse) and add dV_j += P^T dO, dK_j += dS^T Q, dQ_i += dS K with dS = P * (dO V^T - delta) * scale,
    delta = rowsum(dO * O). Everything in fp32; the cotangents come back in the inputs' dtypes.

    dK and dV are accumulated transposed, dK^T += Q^T dS and dV^T += dO^T P, with Q^T and dO^T laid out once per
    call: the products then contract the scores' rows in place, where P^T dO and dS^T Q made XLA write both
    [G * U, U] score blocks transposed in every block pair (on a 2-core CPU, 12% of the tiny preset's train step;
    the step 64.5 -> 59.0 ms)."""
    q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, out_JBKGUH, lse_JBKGU = res
    B, T, N, H = q_BTNH.shape
    K = k_BTKH.shape[2]
    G = N // K
    scale = H ** -0.5
    f32 = jnp.float32
    q_JBKGUH = _head_blocks(q_BTNH.reshape(B, T, K, G, H).astype(f32), U)
    do_JBKGUH = _head_blocks(dout_BTNH.reshape(B, T, K, G, H).astype(f32), U)
    qT_JBKHGU, doT_JBKHGU = jnp.moveaxis(q_JBKGUH, -1, 3), jnp.moveaxis(do_JBKGUH, -1, 3)
    delta_JBKGU = jnp.sum(do_JBKGUH * out_JBKGUH.astype(f32), axis=-1)
    k_JBKUH, v_JBKUH = _head_blocks(k_BTKH.astype(f32), U), _head_blocks(v_BTKH.astype(f32), U)
    seg_JBU = _blocks(segment_ids_BT, U, pad_value=-1)
    pre_JBU = segments.prefix(seg_JBU) if branches else seg_JBU  # read only with branches
    J = q_JBKGUH.shape[0]

    def key_block(dq_JBKGUH, j):
        k_BKUH, v_BKUH, seg_k = k_JBKUH[j], v_JBKUH[j], seg_JBU[j]

        def query_block(i, carry):
            dq_JBKGUH, dkT_BKHU, dvT_BKHU = carry
            q_BKGUH, do_BKGUH = q_JBKGUH[i], do_JBKGUH[i]
            s = jnp.einsum("bkgth,bksh->bkgts", q_BKGUH, k_BKUH) * scale
            visible = _visible(seg_JBU[i], pre_JBU[i], seg_k, i, j, U, branches)[:, None, None]
            p = jnp.where(visible, jnp.exp(s - lse_JBKGU[i][..., None]), 0.0)
            dvT_BKHU = dvT_BKHU + jnp.einsum("bkhgt,bkgts->bkhs", doT_JBKHGU[i], p)
            dp = jnp.einsum("bkgth,bksh->bkgts", do_BKGUH, v_BKUH)
            ds = p * (dp - delta_JBKGU[i][..., None]) * scale
            dkT_BKHU = dkT_BKHU + jnp.einsum("bkhgt,bkgts->bkhs", qT_JBKHGU[i], ds)
            dq_JBKGUH = dq_JBKGUH.at[i].add(jnp.einsum("bkgts,bksh->bkgth", ds, k_BKUH))
            return dq_JBKGUH, dkT_BKHU, dvT_BKHU

        zeros = jnp.zeros((B, K, H, U), f32)
        dq_JBKGUH, dkT_BKHU, dvT_BKHU = jax.lax.fori_loop(j, J, query_block, (dq_JBKGUH, zeros, zeros))
        return dq_JBKGUH, (jnp.swapaxes(dkT_BKHU, -1, -2), jnp.swapaxes(dvT_BKHU, -1, -2))

    dq_JBKGUH, (dk_JBKUH, dv_JBKUH) = jax.lax.scan(key_block, jnp.zeros_like(q_JBKGUH), jnp.arange(J))
    dq_BTNH = _output(dq_JBKGUH, q_BTNH).astype(q_BTNH.dtype)
    return (dq_BTNH, _unhead_blocks(dk_JBKUH, T).astype(k_BTKH.dtype), _unhead_blocks(dv_JBKUH, T).astype(v_BTKH.dtype),
            None)


blocked_attention.defvjp(_fwd, _bwd)
