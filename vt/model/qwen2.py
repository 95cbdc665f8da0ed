"""Qwen2 / Qwen2.5 decoder in Flax NNX, numerically matching transformers' Qwen2ForCausalLM.

Shape letters used in names: B batch, T query length, S key length (cache length when decoding), D hidden,
N query heads, K key/value heads, G = N // K query heads per KV head, H head dim, F MLP hidden, V vocab, L layers.

Inputs follow one convention everywhere in vt:
  tokens_BT     int32 token ids
  positions_BT  int32 rotary positions; restart at 0 for every packed document
  segment_ids_BT int32 document id within the row, 0 = padding; attention never crosses segments
Without a cache the sequence attends causally within its segment. With a cache (decoding), `positions` are also
the cache slots: the keys/values of token t are written at slot positions[b, t] and a query at position p sees
slots 0..p of its own row. Right-padded prompts therefore need no special handling: padding writes garbage at
slots past the prompt, which decoding overwrites before any query can see it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from vt.model.config import ModelConfig
from vt.sharding import constrain

Initializer = Callable[..., jax.Array]


def _param(rngs: nnx.Rngs, init: Initializer, shape, axes, dtype) -> nnx.Param:
    # `axes` names the logical axis of each dimension; vt.sharding maps them to the mesh.
    return nnx.Param(init(rngs.params(), shape, dtype), axes=tuple(axes))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Per-layer key/value buffers, each [B, S, K, H]. A pytree, so it can be donated to jit."""
    k: list[jax.Array]
    v: list[jax.Array]

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, length: int, dtype=None) -> "KVCache":
        dtype = dtype or jnp.dtype(cfg.dtype)
        shape = (batch, length, cfg.num_kv_heads, cfg.head_dim)
        return cls(k=[jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)],
                   v=[jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)])

    @property
    def length(self) -> int:
        return self.k[0].shape[1]


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, cfg: ModelConfig, rngs: nnx.Rngs):
        self.eps = eps
        self.weight = _param(rngs, nnx.initializers.ones, (dim,), ("norm",), jnp.dtype(cfg.param_dtype))

    def __call__(self, x):
        # Statistics in fp32 whatever the compute dtype; the weight multiplies after the cast back, as in HF.
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope(x_BTNH: jax.Array, positions_BT: jax.Array, theta: float) -> jax.Array:
    """Non-interleaved rotary embedding (HF `rotate_half`): pairs are (i, i + H/2). cos/sin and the rotation are
    computed in fp32 and the result cast back to x's dtype."""
    H = x_BTNH.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
    angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    cos = jnp.cos(angles_BTh)[:, :, None, :]
    sin = jnp.sin(angles_BTh)[:, :, None, :]
    x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTNH.dtype)


def _xla_attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS, scale):
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    scores = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32) * scale
    # A large finite negative rather than -inf: a fully masked row (padding) then stays finite instead of NaN.
    scores = jnp.where(mask_BTS[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BSKH.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v_BSKH)
    return out.reshape(B, T, N, H)


def resolve_attention_impl(impl: str, dtype, *, cached: bool) -> str:
    """The implementation a call actually uses, at trace time. "auto" picks from `jax.default_backend()`: splash
    on TPU; cudnn on an NVIDIA GPU when the compute dtype is bf16/fp16 (cuDNN flash attention has no fp32
    kernel); xla otherwise. With a KV cache (`cached`: prefill into a cache and decode) "splash" and "auto" use
    xla: the splash kernel is causal self-attention over one sequence, not queries against cache slots."""
    if impl == "auto":
        if cached:
            return "xla"
        backend = jax.default_backend()
        if backend == "tpu":
            return "splash"
        if backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and _is_cuda():
            return "cudnn"
        return "xla"
    if impl == "splash" and cached:
        return "xla"
    return impl


def _is_cuda() -> bool:
    return "cuda" in jax.devices()[0].client.platform_version.lower()


def attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS, impl: str, segment_ids_BT=None):
    """Attention of q against k, v under mask_BTS (True = may attend). `impl` is a resolved implementation
    (`resolve_attention_impl`), not "auto". "splash" ignores mask_BTS and builds the same causal & same-segment
    mask from `segment_ids_BT` inside the kernel, so it serves only the no-cache path (S == T)."""
    scale = q_BTNH.shape[-1] ** -0.5
    if impl == "xla":
        return _xla_attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS, scale)
    if impl == "splash":
        from vt.model.splash import splash_attention
        return splash_attention(q_BTNH, k_BSKH, v_BSKH, segment_ids_BT)
    return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, mask=mask_BTS[:, None], scale=scale,
                                        implementation="cudnn" if impl == "cudnn" else None)


# Cache blocks for decode attention; caches of fewer than two blocks are attended to in one piece.
DECODE_BLOCK = 512


def _cached_attention(q_BTNH, k_BSKH, v_BSKH, positions_BT, scale, block: int = DECODE_BLOCK):
    """Queries at `positions_BT` against a KV cache, reading only the cache blocks up to the largest position in
    the batch, with an online softmax across blocks (as flash-decoding does). The cache is sized for the longest
    possible sample, so attending to all of it would make every decode step cost the full cache length; this
    costs the current length. The trip count is data-dependent (a while loop), so it is for the cache path only,
    which is never differentiated. fp32 scores and accumulators; equal to `_xla_attention` up to rounding."""
    B, T, N, H = q_BTNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    neg = jnp.finfo(jnp.float32).min
    n_blocks = jnp.minimum(jnp.max(positions_BT) // block + 1, S // block)

    def one_block(i, carry):
        m_BKGT, l_BKGT, acc_BKGTH = carry
        start = i * block
        k_blk = jax.lax.dynamic_slice_in_dim(k_BSKH, start, block, axis=1)
        v_blk = jax.lax.dynamic_slice_in_dim(v_BSKH, start, block, axis=1)
        s = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_blk, preferred_element_type=jnp.float32) * scale
        visible_BTS = (start + jnp.arange(block))[None, None, :] <= positions_BT[:, :, None]
        s = jnp.where(visible_BTS[:, None, None], s, neg)
        m_new = jnp.maximum(m_BKGT, s.max(-1))
        p = jnp.exp(s - m_new[..., None])
        correction = jnp.exp(m_BKGT - m_new)
        l_new = l_BKGT * correction + p.sum(-1)
        pv = jnp.einsum("bkgts,bskh->bkgth", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
        return m_new, l_new, acc_BKGTH * correction[..., None] + pv

    G = N // K
    init = (jnp.full((B, K, G, T), neg, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
            jnp.zeros((B, K, G, T, H), jnp.float32))
    _, l_BKGT, acc_BKGTH = jax.lax.fori_loop(0, n_blocks, one_block, init)
    # Block 0 always holds a visible slot (positions >= 0), so l > 0.
    out_BKGTH = acc_BKGTH / l_BKGT[..., None]
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H).astype(v_BSKH.dtype)


def _write_cache(buf_BSKH, new_BTKH, start_B):
    """Write each row's new keys at its own offset (rows decode at different positions under slot refill)."""
    # One scatter of B*T rows rather than vmap(dynamic_update_slice): on CPU the vmapped form compiles to a
    # scatter that rewrites the whole cache every decode step (2.3x slower decode at S=384).
    B, T = new_BTKH.shape[:2]
    slots_BT = start_B[:, None] + jnp.arange(T, dtype=start_B.dtype)
    return buf_BSKH.at[jnp.arange(B)[:, None], slots_BT].set(new_BTKH.astype(buf_BSKH.dtype), unique_indices=True)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pd = jnp.dtype(cfg.param_dtype)
        w = nnx.initializers.normal(cfg.initializer_range)
        self.q_kernel = _param(rngs, w, (D, N, H), ("embed", "heads", "head_dim"), pd)
        self.q_bias = _param(rngs, nnx.initializers.zeros, (N, H), ("heads", "head_dim"), pd)
        self.k_kernel = _param(rngs, w, (D, K, H), ("embed", "kv_heads", "head_dim"), pd)
        self.k_bias = _param(rngs, nnx.initializers.zeros, (K, H), ("kv_heads", "head_dim"), pd)
        self.v_kernel = _param(rngs, w, (D, K, H), ("embed", "kv_heads", "head_dim"), pd)
        self.v_bias = _param(rngs, nnx.initializers.zeros, (K, H), ("kv_heads", "head_dim"), pd)
        self.o_kernel = _param(rngs, w, (N, H, D), ("heads", "head_dim", "embed"), pd)

    def __call__(self, x_BTD, positions_BT, segment_ids_BT, cache_kv):
        cfg, dt = self.cfg, x_BTD.dtype
        q = jnp.einsum("btd,dnh->btnh", x_BTD, self.q_kernel[...].astype(dt)) + self.q_bias[...].astype(dt)
        k = jnp.einsum("btd,dkh->btkh", x_BTD, self.k_kernel[...].astype(dt)) + self.k_bias[...].astype(dt)
        v = jnp.einsum("btd,dkh->btkh", x_BTD, self.v_kernel[...].astype(dt)) + self.v_bias[...].astype(dt)
        q = constrain(rope(q, positions_BT, cfg.rope_theta), ("batch", "sequence", "act_heads", "head_dim"))
        k = rope(k, positions_BT, cfg.rope_theta)

        if cache_kv is None:
            T = x_BTD.shape[1]
            causal_TT = jnp.tril(jnp.ones((T, T), dtype=bool))
            same_doc_BTT = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
            mask_BTS = causal_TT[None] & same_doc_BTT
            new_cache = None
        else:
            k_cache, v_cache = cache_kv
            start_B = positions_BT[:, 0]
            k_cache = _write_cache(k_cache, k, start_B)
            v_cache = _write_cache(v_cache, v, start_B)
            k, v = k_cache, v_cache
            slots_S = jnp.arange(k_cache.shape[1])
            mask_BTS = slots_S[None, None, :] <= positions_BT[:, :, None]
            new_cache = (k_cache, v_cache)

        impl = resolve_attention_impl(cfg.attention_impl, dt, cached=cache_kv is not None)
        S = k.shape[1]
        if cache_kv is not None and impl == "xla" and S >= 2 * DECODE_BLOCK and S % DECODE_BLOCK == 0:
            out_BTNH = _cached_attention(q, k.astype(dt), v.astype(dt), positions_BT, q.shape[-1] ** -0.5)
        else:
            out_BTNH = attention(q, k.astype(dt), v.astype(dt), mask_BTS, impl, segment_ids_BT)
        out_BTD = jnp.einsum("btnh,nhd->btd", out_BTNH, self.o_kernel[...].astype(dt))
        return out_BTD, new_cache


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        D, F = cfg.hidden_size, cfg.intermediate_size
        pd = jnp.dtype(cfg.param_dtype)
        w = nnx.initializers.normal(cfg.initializer_range)
        self.gate_kernel = _param(rngs, w, (D, F), ("embed", "mlp"), pd)
        self.up_kernel = _param(rngs, w, (D, F), ("embed", "mlp"), pd)
        self.down_kernel = _param(rngs, w, (F, D), ("mlp", "embed"), pd)

    def __call__(self, x_BTD):
        dt = x_BTD.dtype
        gate = x_BTD @ self.gate_kernel[...].astype(dt)
        up = x_BTD @ self.up_kernel[...].astype(dt)
        h_BTF = constrain(jax.nn.silu(gate) * up, ("batch", "sequence", "act_mlp"))
        return h_BTF @ self.down_kernel[...].astype(dt)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg, rngs)
        self.attn = Attention(cfg, rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x_BTD, positions_BT, segment_ids_BT, cache_kv):
        h, new_cache = self.attn(self.input_norm(x_BTD), positions_BT, segment_ids_BT, cache_kv)
        x_BTD = x_BTD + h
        x_BTD = x_BTD + self.mlp(self.post_attn_norm(x_BTD))
        return constrain(x_BTD, ("batch", "sequence", "act_embed")), new_cache


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Qwen2(nnx.Module):
    """Qwen2ForCausalLM. `__call__` returns (logits_BTV in float32, updated KVCache or None)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        Vp, D = cfg.padded_vocab_size, cfg.hidden_size
        pd = jnp.dtype(cfg.param_dtype)
        self.embed = _param(rngs, nnx.initializers.normal(cfg.initializer_range), (Vp, D), ("vocab", "embed"), pd)
        self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(D, cfg.rms_norm_eps, cfg, rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, nnx.initializers.normal(cfg.initializer_range), (D, Vp),
                                  ("embed", "vocab"), pd)

    def __call__(self, tokens_BT, positions_BT=None, segment_ids_BT=None, cache: KVCache | None = None,
                 logits_at_B=None):
        """`logits_at_B` (int [B]): compute logits only at that column of each row, returning [B, V]. A prefill
        needs one logit row per prompt, and [B, T, V] float32 logits would not fit at real sizes."""
        x_BTD, new_cache = self.hidden_states(tokens_BT, positions_BT, segment_ids_BT, cache, logits_at_B)
        logits_BTV = self.logits(x_BTD)
        if logits_at_B is not None:
            logits_BTV = logits_BTV[:, 0]
        return logits_BTV, new_cache

    def head_DV(self) -> jax.Array:
        """The LM head [D, padded V] in the parameter dtype (the embedding transposed when tied)."""
        return self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]

    def logits(self, x_BTD) -> jax.Array:
        """float32 logits [B, T, vocab_size] of final-normed hidden states (padded vocabulary rows cut)."""
        dt = jnp.dtype(self.cfg.dtype)
        logits_BTV = jnp.einsum("btd,dv->btv", x_BTD.astype(dt), self.head_DV().astype(dt),
                                preferred_element_type=jnp.float32)
        return logits_BTV[..., : self.cfg.vocab_size]

    def hidden_states(self, tokens_BT, positions_BT=None, segment_ids_BT=None, cache: KVCache | None = None,
                      logits_at_B=None):
        """Final-normed hidden states [B, T, D] (or [B, 1, D] at `logits_at_B`) and the updated cache. Losses
        over long rows project these through `head_DV` in chunks instead of materialising [B, T, V] logits."""
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        B, T = tokens_BT.shape
        if positions_BT is None:
            positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        if segment_ids_BT is None:
            segment_ids_BT = jnp.ones((B, T), jnp.int32)
        # The table gathered over fsdp first (as every FSDP weight is before use), split over vocab only: XLA then
        # looks tokens up in each vocab shard in place and sums the shards, keeping the batch split. Indexing the
        # fsdp-split table directly makes the partitioner replicate the whole lookup ("involuntary full
        # rematerialization") when tensor > 1.
        table_VD = constrain(self.embed[...], ("vocab", None))
        x_BTD = constrain(table_VD[tokens_BT].astype(dt), ("batch", "sequence", "act_embed"))

        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            cache_kv = None if cache is None else (cache.k[i], cache.v[i])
            if cfg.remat_policy != "none" and cache is None:
                x_BTD, kv = nnx.remat(lambda lyr, *a: lyr(*a), policy=_REMAT_POLICIES[cfg.remat_policy])(
                    layer, x_BTD, positions_BT, segment_ids_BT, None)
            else:
                x_BTD, kv = layer(x_BTD, positions_BT, segment_ids_BT, cache_kv)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])

        if logits_at_B is not None:
            x_BTD = jnp.take_along_axis(x_BTD, logits_at_B[:, None, None], axis=1)  # [B, 1, D]
        x_BTD = self.final_norm(x_BTD)
        return x_BTD, (None if cache is None else KVCache(k=new_k, v=new_v))
