"""Qwen2 / Qwen2.5 and dense Qwen3 decoder in Flax NNX, numerically matching transformers' Qwen2ForCausalLM and
Qwen3ForCausalLM. The families differ in the attention only, by ModelConfig fields: Qwen2 adds a bias to the q/k/v
projections (`attention_bias`); Qwen3 has none, but RMS-normalises every query and key head over head_dim before
the rotary embedding (`qk_norm`), and its head_dim is not hidden / heads.

Shape letters used in names: B batch, T query length, S key length (cache length when decoding), D hidden,
N query heads, K key/value heads, G = N // K query heads per KV head, H head dim, F MLP hidden, V vocab, L layers.

The decoder layers are one `DecoderLayer` whose parameters carry a leading layer axis (logical name `layers`),
run by `jax.lax.scan`: every path (training, scoring, prefill, decode) traces and compiles one layer body, so
compile time does not grow with depth. The KV cache (vt.model.kv_pages) holds every layer's pages and rides in
the scan's carry; each layer writes and reads its own index of it in place. Attention without a cache is
vt.model.attention, with its implementation picked when the model is built.

Inputs follow one convention everywhere in vt:
  tokens_BT     int32 token ids
  positions_BT  int32 rotary positions; restart at 0 for every packed document
  segment_ids_BT int32 document id within the row, 0 = padding; attention never crosses segments
Without a cache the sequence attends causally within its segment. With a cache (decoding), `positions` are also
the cache positions: the keys/values of token t are written at position positions[b, t] of row b's pages and a
query at position p sees positions 0..p of its own row. Right-padded prompts therefore need no special
handling: padding writes garbage past the prompt, which decoding overwrites before any query can see it.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vt.model import lora
from vt.model.attention import resolve, self_attention
from vt.model.blocked_attention import ATTENTION_LSE, ATTENTION_OUT
from vt.model.config import ModelConfig, resolve_remat
from vt.model.kv_pages import PagedKVCache
from vt.sharding import constrain, state_shardings

Initializer = Callable[..., jax.Array]


def _param(rngs: nnx.Rngs, init: Initializer, shape, axes, dtype, stack: int | None = None) -> nnx.Param:
    """`axes` names the logical axis of each dimension; vt.sharding maps them to the mesh. `stack` = L prepends
    the layer axis: the L layers' weights are drawn by one random op (one per weight kind, whatever the depth),
    which keeps the jitted random init's compile time independent of depth."""
    if stack is not None:
        shape, axes = (stack, *shape), ("layers", *axes)
    return nnx.Param(init(rngs.params(), shape, dtype), axes=tuple(axes))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
        self.eps = eps
        self.weight = _param(rngs, nnx.initializers.ones, (dim,), ("norm",), jnp.dtype(cfg.param_dtype), stack)

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


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
        self.cfg = cfg
        D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pd = jnp.dtype(cfg.param_dtype)
        w = nnx.initializers.normal(cfg.initializer_range)
        zeros = nnx.initializers.zeros
        # Created in this order (each draws a key, zeros too), so a Qwen2 model's random init is what it was
        # before Qwen3 existed: the tests' seeds and the thresholds measured with them stay valid.
        bias = cfg.attention_bias
        self.q_kernel = _param(rngs, w, (D, N, H), ("embed", "heads", "head_dim"), pd, stack)
        if bias:
            self.q_bias = _param(rngs, zeros, (N, H), ("heads", "head_dim"), pd, stack)
        self.k_kernel = _param(rngs, w, (D, K, H), ("embed", "kv_heads", "head_dim"), pd, stack)
        if bias:
            self.k_bias = _param(rngs, zeros, (K, H), ("kv_heads", "head_dim"), pd, stack)
        self.v_kernel = _param(rngs, w, (D, K, H), ("embed", "kv_heads", "head_dim"), pd, stack)
        if bias:
            self.v_bias = _param(rngs, zeros, (K, H), ("kv_heads", "head_dim"), pd, stack)
        self.o_kernel = _param(rngs, w, (N, H, D), ("heads", "head_dim", "embed"), pd, stack)
        if cfg.qk_norm:  # one [H] weight shared by every head, as HF's q_norm / k_norm
            self.q_norm = RMSNorm(H, cfg.rms_norm_eps, cfg, rngs, stack)
            self.k_norm = RMSNorm(H, cfg.rms_norm_eps, cfg, rngs, stack)
        self.impl = resolve(cfg.attention_impl, cfg.dtype)  # decided once, for every call's no-cache attention
        self.branches = cfg.segment_branches

    def __call__(self, x_BTD, positions_BT, segment_ids_BT, cache: PagedKVCache | None = None, layer=None):
        """One layer's attention (its own, unstacked weights). With a cache, `layer` is this layer's index into
        it, and the cache comes back with this call's keys and values written."""
        cfg, dt = self.cfg, x_BTD.dtype
        q = lora.project(self, "q", "btd,dnh->btnh", x_BTD)
        k = lora.project(self, "k", "btd,dkh->btkh", x_BTD)
        v = lora.project(self, "v", "btd,dkh->btkh", x_BTD)
        if cfg.attention_bias:
            q, k, v = (q + self.q_bias[...].astype(dt), k + self.k_bias[...].astype(dt), v + self.v_bias[...].astype(dt))
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(rope(q, positions_BT, cfg.rope_theta), ("batch", "sequence", "act_heads", "head_dim"))
        k = rope(k, positions_BT, cfg.rope_theta)
        if cache is None:
            out_BTNH = self_attention(q, k, v, segment_ids_BT, self.impl, self.branches)
        else:
            cache = cache.write(layer, k, v, positions_BT)
            out_BTNH = cache.attend(layer, q, k, v, positions_BT, segment_ids_BT, self.impl)
        out_BTD = lora.project(self, "o", "btnh,nhd->btd", out_BTNH)
        return out_BTD, cache


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
        D, F = cfg.hidden_size, cfg.intermediate_size
        pd = jnp.dtype(cfg.param_dtype)
        w = nnx.initializers.normal(cfg.initializer_range)
        self.gate_kernel = _param(rngs, w, (D, F), ("embed", "mlp"), pd, stack)
        self.up_kernel = _param(rngs, w, (D, F), ("embed", "mlp"), pd, stack)
        self.down_kernel = _param(rngs, w, (F, D), ("mlp", "embed"), pd, stack)

    def __call__(self, x_BTD):
        gate = lora.project(self, "gate", "btd,df->btf", x_BTD)
        up = lora.project(self, "up", "btd,df->btf", x_BTD)
        h_BTF = constrain(jax.nn.silu(gate) * up, ("batch", "sequence", "act_mlp"))
        return lora.project(self, "down", "btf,fd->btd", h_BTF)


class DecoderLayer(nnx.Module):
    """One decoder layer; built with `stack` = L it holds all L layers' weights stacked (see `scan_layers`)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg, rngs, stack)
        self.attn = Attention(cfg, rngs, stack)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg, rngs, stack)
        self.mlp = MLP(cfg, rngs, stack)

    def __call__(self, x_BTD, positions_BT, segment_ids_BT, cache: PagedKVCache | None = None, layer=None):
        h, new_cache = self.attn(self.input_norm(x_BTD), positions_BT, segment_ids_BT, cache, layer)
        x_BTD = x_BTD + h
        x_BTD = x_BTD + self.mlp(self.post_attn_norm(x_BTD))
        return constrain(x_BTD, ("batch", "sequence", "act_embed")), new_cache


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    # The blocked attention's output and log-sum-exp (vt.model.blocked_attention): the recomputed layer runs its
    # projections, norms and MLP again but not the attention's block loops. Where attention is not blocked (rows
    # under two blocks, the splash, jax and cudnn kernels) nothing is named: there it is "full".
    "save_attention": jax.checkpoint_policies.save_only_these_names(ATTENTION_OUT, ATTENTION_LSE),
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Qwen2(nnx.Module):
    """Qwen2ForCausalLM or Qwen3ForCausalLM (ModelConfig.hf_architecture). `__call__` returns (logits_BTV in float32, updated PagedKVCache or None)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        Vp, D = cfg.padded_vocab_size, cfg.hidden_size
        pd = jnp.dtype(cfg.param_dtype)
        self.embed = _param(rngs, nnx.initializers.normal(cfg.initializer_range), (Vp, D), ("vocab", "embed"), pd)
        self.layers = DecoderLayer(cfg, rngs, stack=cfg.num_layers)
        self.final_norm = RMSNorm(D, cfg.rms_norm_eps, cfg, rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, nnx.initializers.normal(cfg.initializer_range), (D, Vp),
                                  ("embed", "vocab"), pd)
        if cfg.lora_rank:  # last, so the base weights draw the same numbers with or without adapters
            lora.add_adapters(self.layers, cfg, rngs)

    def __call__(self, tokens_BT, positions_BT=None, segment_ids_BT=None, cache: PagedKVCache | None = None,
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

    def hidden_states(self, tokens_BT, positions_BT=None, segment_ids_BT=None, cache: PagedKVCache | None = None,
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

        x_BTD, cache = scan_layers(self.layers, x_BTD, positions_BT, segment_ids_BT, cache,
                                   resolve_remat(cfg.remat_policy, cfg.hidden_size))
        if logits_at_B is not None:
            x_BTD = jnp.take_along_axis(x_BTD, logits_at_B[:, None, None], axis=1)  # [B, 1, D]
        x_BTD = self.final_norm(x_BTD)
        return x_BTD, cache


def scan_layers(layers: DecoderLayer, x_BTD, positions_BT, segment_ids_BT, cache: PagedKVCache | None,
                remat_policy: str):
    """Run the stacked layers in order with `jax.lax.scan`: one traced layer body whatever the depth. Without a
    cache (training, scoring) the body is rematerialised under `remat_policy`, so the backward pass keeps only
    each layer's input; with a cache (prefill, decode: never differentiated) the cache rides in the carry and
    each layer updates its own index in place."""
    graphdef, stacked = nnx.split(layers)
    num_layers = jax.tree.leaves(stacked)[0].shape[0]

    def body(carry, xs):
        x_BTD, cache = carry
        weights, i = xs
        with lora.layer_scope(i):  # folded into the LoRA dropout key, when there is one
            x_BTD, cache = nnx.merge(graphdef, weights)(x_BTD, positions_BT, segment_ids_BT, cache, i)
        return (x_BTD, cache), None

    if cache is None and remat_policy != "none":
        # prevent_cse=False: inside a scan the loop already keeps XLA from merging the recomputation away.
        body = jax.checkpoint(body, policy=_REMAT_POLICIES[remat_policy], prevent_cse=False)
    (x_BTD, cache), _ = jax.lax.scan(body, (x_BTD, cache), (stacked, jnp.arange(num_layers, dtype=jnp.int32)),
                                     unroll=1 if cache is None else cache.scan_unroll)
    return x_BTD, cache


# --- building a model ---------------------------------------------------------------------------------------------

def abstract_model(cfg: ModelConfig) -> Qwen2:
    """The model with ShapeDtypeStructs in place of arrays: costs no memory."""
    return nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0)))


def model_shardings(cfg: ModelConfig, mesh):
    return state_shardings(nnx.state(abstract_model(cfg)), mesh)


@functools.lru_cache(maxsize=8)
def init_fn(cfg: ModelConfig, mesh=None):
    """The jitted random init of the parameter state from a key's data (`init_key(seed)`), each parameter created
    in its sharding on `mesh` (out_shardings). The stacked decoder weights are drawn by one op per weight kind, so
    this compiles in the same time at any depth; the key is an argument, not a constant, so one compilation serves
    every seed (a tiny model's init compiles in ~2 s on a CPU: it was once per seed)."""
    def init_state(key_data):
        return nnx.state(Qwen2(cfg, rngs=nnx.Rngs(jax.random.wrap_key_data(key_data))))

    if mesh is None:
        return jax.jit(init_state)
    return jax.jit(init_state, out_shardings=model_shardings(cfg, mesh))


def init_key(seed: int) -> np.ndarray:
    """`jax.random.key(seed)`'s data, as a host array: the same value on every process (a replicated input of a
    multi-process jit)."""
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


def create_model(cfg: ModelConfig, mesh=None, seed: int = 0) -> Qwen2:
    """Random-init model. With a mesh, each parameter is initialised already sharded (jit with out_shardings),
    so no device or host ever holds the whole model."""
    graphdef, _ = nnx.split(abstract_model(cfg))
    return nnx.merge(graphdef, init_fn(cfg, mesh)(init_key(seed)))
