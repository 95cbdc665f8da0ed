"""Splash attention: the Pallas TPU flash-attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`)
for vt's no-cache attention, causal within each packed document.

Used by `attention_impl="splash"` (and `"auto"` on TPU) for calls without a KV cache: training, scoring and
any full-sequence forward, and the prefill of a prompt into fresh KV pages; decode over the pages has its
own attention (vt.model.kv_pages).

The kernel works on one example at a time with heads leading, q [N, T, H] and k, v [K, T, H], and does not
scale q; `splash_attention` takes vt's [B, T, N, H] layout, scales q by H**-0.5 and vmaps over the batch.

GQA: the kernel's MHA variant (`make_splash_mha`, is_mqa=False) accepts N query heads against K = N / G
key/value heads and reads kv head h // G for query head h, which is exactly Qwen2's grouping (query heads
g*G .. g*G + G-1 share kv head g, the reshape [N] -> [K, G] in `_xla_attention`). So k and v are passed as they
are, never repeated G times in memory, and one pallas_call covers all heads. (The MQA variant would need a vmap
over kv heads with q regrouped to [K, G, T, H]; same result, more reshapes.)

Sharding: a pallas_call cannot be partitioned by XLA, which would all-gather q, k, v around it. Under a mesh
(`vt.sharding.use_mesh`) the kernel therefore runs inside `jax.shard_map`: batch over the mesh axes of the
logical axis "batch", heads over those of "act_heads"/"act_kv_heads" (vt.sharding.LOGICAL_RULES).
Splitting N and K heads over the same t devices keeps the grouping local: shard s holds query heads
s*N/t .. and kv heads s*K/t .., and local query head n maps to local kv head n // G. When K does not divide
over the head axes but N does (e.g. 2 kv heads on tensor=4), k and v are repeated to N heads first (G = 1
locally); when neither divides, heads stay replicated. The sequence is never split (the kernel cannot shard
the kv sequence).

Sequence length: the kernel's blocks are multiples of 128 (`MIN_BLOCK`) and must divide the sequence.
A length that is not a multiple of 128 is padded at the end with zero q/k/v under a segment id (-1) that no
real token has, so real tokens never see the padding and each padding query sees at least itself; the padded
rows are cut off the output. This costs at most 127 extra positions of compute; pack to multiples of 128
to avoid it.

On a backend other than TPU the kernel runs in Pallas interpret mode (`interpret=True`): correct but slow,
meant for CPU tests, not for GPU training (use "jax" there).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as _sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as _sm

from vt import VtError
from vt.sharding import activation_spec, platform

MIN_BLOCK = _sk.NUM_LANES  # 128: every splash block size is a multiple of this
_BLOCK_CHOICES = (512, 256, 128)  # largest that divides the (padded) sequence; 512 is the usual TPU choice
_PAD_SEGMENT = -1  # vt segment ids are >= 0 (0 = padding documents), so -1 marks only the alignment padding


def block_size(seq_len: int) -> int:
    """Block size for q and kv (forward and both backward kernels) for a padded sequence length."""
    if seq_len <= 0 or seq_len % MIN_BLOCK:
        raise VtError(f"splash attention: sequence length {seq_len} is not a positive multiple of {MIN_BLOCK}")
    return next(b for b in _BLOCK_CHOICES if seq_len % b == 0)


def _make_kernel(num_heads: int, seq_len: int, interpret: bool):
    b = block_size(seq_len)
    sizes = _sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b,
                           block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,
                           block_q_dq=b, block_kv_dq=b)
    # The causal mask is static (block sparsity computed in numpy at trace time, cached by jax per
    # (mask, block shape), so 28 layers cost one mask analysis); documents come in through SegmentIds.
    mask = _sm.MultiHeadMask([_sm.CausalMask((seq_len, seq_len)) for _ in range(num_heads)])
    return _sk.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)


def _local(q_BNTH, k_BKTH, v_BKTH, seg_BT, interpret: bool):
    """Kernel on unsharded (or per-shard) arrays, vmapped over the batch."""
    kernel = _make_kernel(q_BNTH.shape[1], q_BNTH.shape[2], interpret)
    return jax.vmap(lambda q, k, v, s: kernel(q, k, v, _sk.SegmentIds(q=s, kv=s)))(q_BNTH, k_BKTH, v_BKTH, seg_BT)


def _names(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def splash_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, segment_ids_BT: jax.Array, *,
                     interpret: bool | None = None) -> jax.Array:
    """Causal attention within segments (token t sees s <= t with the same segment id), GQA, softmax scale
    H**-0.5. Returns [B, T, N, H] in q's dtype. `interpret=None` means interpret mode unless the program is built
    for TPU devices (vt.sharding.platform: the mesh's, so a TPU topology compiled from a CPU host gets the kernel)."""
    if interpret is None:
        interpret = platform() != "tpu"
    B, T, N, H = q_BTNH.shape
    K = k_BTKH.shape[2]
    if k_BTKH.shape != (B, T, K, H) or v_BTKH.shape != k_BTKH.shape or N % K:
        raise VtError(f"splash attention: q {q_BTNH.shape}, k {k_BTKH.shape}, v {v_BTKH.shape} are not "
                      "self-attention shapes [B, T, N, H], [B, T, K, H] with N a multiple of K")
    if segment_ids_BT.shape != (B, T):
        raise VtError(f"splash attention: segment ids {segment_ids_BT.shape} do not match q {q_BTNH.shape}")
    # The kernel does not scale; scale in fp32 and round once to the compute dtype.
    q_BTNH = (q_BTNH.astype(jnp.float32) * H ** -0.5).astype(q_BTNH.dtype)
    seg_BT = segment_ids_BT.astype(jnp.int32)
    pad = -T % MIN_BLOCK
    if pad:
        widths = ((0, 0), (0, pad), (0, 0), (0, 0))
        q_BTNH, k_BTKH, v_BTKH = (jnp.pad(x, widths) for x in (q_BTNH, k_BTKH, v_BTKH))
        seg_BT = jnp.pad(seg_BT, ((0, 0), (0, pad)), constant_values=_PAD_SEGMENT)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q_BTNH, k_BTKH, v_BTKH))  # [B, heads, T, H]

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = _local(q, k, v, seg_BT, interpret)
    else:
        batch = activation_spec((B,), ("batch",), mesh)[0]
        q_heads = activation_spec((N,), ("act_heads",), mesh)[0]
        kv_heads = activation_spec((K,), ("act_kv_heads",), mesh)[0]
        if _names(q_heads) != _names(kv_heads):
            if q_heads is not None:  # kv heads do not split like the query heads: give each query head its own
                k, v = (jnp.repeat(x, N // K, axis=1) for x in (k, v))
                kv_heads = q_heads
            else:
                kv_heads = None
        qs, kvs, ss = jax.P(batch, q_heads, None, None), jax.P(batch, kv_heads, None, None), jax.P(batch, None)
        # check_vma=False: the pallas_call carries no varying-manual-axes annotations.
        out = jax.shard_map(lambda *a: _local(*a, interpret), mesh=mesh, in_specs=(qs, kvs, kvs, ss),
                            out_specs=qs, check_vma=False)(q, k, v, seg_BT)
    return out.transpose(0, 2, 1, 3)[:, :T]
