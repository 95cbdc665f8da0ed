"""Attention block by block with an online softmax (as flash attention and flash-decoding do), shared by the
blocked self-attention (vt.model.blocked_attention) and attention over KV pages (vt.model.kv_pages): each reads
its own blocks of keys and values and folds them into one running (max, sum, accumulator) triple. fp32
statistics; equal to dense attention up to rounding. Shape letters as in vt.model.qwen2."""
from __future__ import annotations

import jax.numpy as jnp

Carry = tuple  # (max [B, K, G, T], sum [B, K, G, T], accumulator [B, K, G, T, H]), all float32


def start(B: int, K: int, G: int, T: int, H: int) -> Carry:
    """Nothing seen yet: max -inf (the float32 minimum, so exp() of differences stays finite), sum and acc 0."""
    return (jnp.full((B, K, G, T), jnp.finfo(jnp.float32).min, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
            jnp.zeros((B, K, G, T, H), jnp.float32))


def fold_block(carry: Carry, q_blk, k_blk, v_blk, visible_BTS, scale, kv_axes: str, q_axes: str = "btkgh") -> Carry:
    """Fold one block of keys/values into the carry. `kv_axes` names the block's layout in einsum letters with s
    for its positions: "bskh" ([B, S, K, H], a blocked row), "bksh" ([B, K, S, H], heads first) or "kbsh"
    ([K, B, S, H], gathered pages); `q_axes` the queries' ("btkgh", or "bkgth" heads first: the layout of the
    scores, so the block's matmuls need no transposes)."""
    m_BKGT, l_BKGT, acc_BKGTH = carry
    s = jnp.einsum(f"{q_axes},{kv_axes}->bkgts", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
    s = jnp.where(visible_BTS[:, None, None], s, jnp.finfo(jnp.float32).min)
    m_new = jnp.maximum(m_BKGT, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    correction = jnp.exp(m_BKGT - m_new)
    l_new = l_BKGT * correction + p.sum(-1)
    pv = jnp.einsum(f"bkgts,{kv_axes}->bkgth", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
    return m_new, l_new, acc_BKGTH * correction[..., None] + pv


def normalized(carry: Carry):
    """The attention output in the carry's own layout, float32 [B, K, G, T, H]. Callers start at block 0, which
    always holds a visible position (positions >= 0), so the sum is > 0."""
    _, l_BKGT, acc_BKGTH = carry
    return acc_BKGTH / l_BKGT[..., None]


def finish(carry: Carry, dtype):
    """The attention output [B, T, N, H] in `dtype`."""
    out_BKGTH = normalized(carry)
    B, K, G, T, H = out_BKGTH.shape
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, K * G, H).astype(dtype)
