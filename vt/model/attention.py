"""Attention without a KV cache: a row attends causally to itself within its segments (packed documents). Every
path that has no cache (training, scoring, prefill of a prompt into fresh pages) goes through `self_attention`
with an implementation `resolve` picked once, when the model is built. Decode attention, which reads a KV cache,
belongs to the cache (vt.model.kv_pages). Adding an implementation: a name in vt.model.config.IMPLS and a branch in
`self_attention`. Shape letters as in vt.model.qwen2.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from vt import VtError
from vt.model import segments
from vt.model.blocked_attention import blocked_attention
from vt.sharding import is_cuda, platform


# Query/key blocks of the "xla" self-attention: rows shorter than two ATTENTION_BLOCKs are attended to in one piece,
# longer rows in blocks that grow with the row (`attention_block`).
ATTENTION_BLOCK = 64


def attention_block(T: int) -> int:
    """The block size for rows of T positions: ATTENTION_BLOCK, doubled from 4 blocks' length (256 positions) and
    doubled again from 16 (1,024). Fewer, larger blocks mean fewer loop trips and larger matmuls, until a block is
    so large that its masked upper half costs more. Tiny preset's train step on a 2-core CPU, block sizes
    alternated in one process, fastest step (rows x length, then ms per block size): 8 x 256: 64 60.2, 128 56.4,
    256 91.2; 4 x 512: 64 85.9, 128 73.7, 256 90.5; 2 x 1024: 64 160.7, 128 104.9, 256 97.3; 1 x 2048: 128 182.0,
    256 140.9, 512 148.1; 16 x 128: 64 52.1 against one dense block's 79.1. The forward alone (scoring, prefill),
    blocks of 64 against this rule: 8 x 256 15.2 / 14.6 ms, 4 x 512 27.0 / 19.1, 2 x 1024 57.8 / 28.1."""
    return ATTENTION_BLOCK * (4 if T >= 16 * ATTENTION_BLOCK else 2 if T >= 4 * ATTENTION_BLOCK else 1)


def resolve(impl: str, dtype) -> str:
    """The implementation `impl` runs as for compute dtype `dtype` on the platform programs are built for
    (vt.sharding.platform: the mesh's devices, so a TPU topology compiled from a CPU host gets splash): "auto"
    chosen, and "jax" made "cudnn" where cuDNN's flash kernel applies (NVIDIA GPU, bf16/fp16)."""
    backend = platform()
    cudnn = backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and is_cuda()
    if impl == "auto":
        impl = "splash" if backend == "tpu" else "jax" if cudnn else "xla"
    return "cudnn" if impl == "jax" and cudnn else impl


def supports_branches(impl: str) -> bool:
    """Can the resolved implementation `impl` mask branch segments (vt.model.segments)? Splash's kernel compares
    segment ids for equality only, so a branch would not see its prefix there."""
    return impl != "splash"


def dense_attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS, scale):
    """Reference attention of q against k, v under mask_BTS (True = may attend), fp32 scores."""
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    scores = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32) * scale
    # A large finite negative rather than -inf: a fully masked row (padding) then stays finite instead of NaN.
    scores = jnp.where(mask_BTS[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BSKH.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v_BSKH)
    return out.reshape(B, T, N, H)


def self_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, impl: str, branches: bool = False):
    """Causal attention of a row to itself within segments (with `branches`, a branch segment also sees its
    prefix document: vt.model.segments); `impl` is resolved (`resolve`). "splash" builds the causal &
    same-segment mask from the segment ids inside the kernel (no branches: `supports_branches`); the others get
    it as a dense mask, except "xla" on rows of two blocks or more, which runs block by block (no [B, N, T, T]
    scores, blocks above the diagonal skipped)."""
    T, H = q_BTNH.shape[1], q_BTNH.shape[-1]
    if branches and not supports_branches(impl):
        raise VtError(f"attention {impl!r} cannot mask branch segments (vt.model.segments); use 'xla' or 'jax'")
    if impl == "splash":
        from vt.model.splash import splash_attention
        return splash_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT)
    if impl == "xla" and T >= 2 * ATTENTION_BLOCK:
        return blocked_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, attention_block(T), branches)
    mask_BTT = jnp.tril(jnp.ones((T, T), dtype=bool))[None] & segments.visible(
        segment_ids_BT[:, :, None], segment_ids_BT[:, None, :], branches=branches)
    if impl == "xla":
        return dense_attention(q_BTNH, k_BTKH, v_BTKH, mask_BTT, H ** -0.5)
    return jax.nn.dot_product_attention(q_BTNH, k_BTKH, v_BTKH, mask=mask_BTT[:, None], scale=H ** -0.5,
                                        implementation="cudnn" if impl == "cudnn" else None)
