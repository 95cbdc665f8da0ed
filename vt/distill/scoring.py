"""The student's length-normalised NLL of a trace (RECIPE stage 4):

    S_LP(q, y) = -(1/|y|) sum_{t=1}^{|y|} log pi_student(y_t | q, y_<t)

One jitted forward per batch of (prompt ids, completion ids) pairs, rows sorted by length and padded to a
power-of-two bucket so a whole data set compiles a handful of programs. With ``chunk_tokens`` > 0 the
sequence goes through the model in chunks of that many tokens with a KV cache (pages of `SCORING_PAGE`
tokens, each row owning a fixed run of them), so the activations held at once are those of a chunk. Either way
the log-probs come from the hidden states in sequence chunks (vt.train.losses.token_logps), never as float32
[B, T, V] logits (at T = 32K and V = 152K a single row's would be 20 GB). With a mesh, rows are split over the
mesh's data x fsdp axes (the model's own sharding does the rest; the KV pages are split over kv heads only);
the batch size must divide by that product.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vt import VtError
from vt.buckets import bucket
from vt.model.kv_pages import PagedKVCache
from vt.sharding import param_sharding, use_mesh
from vt.train.losses import masked_nll_sum, token_logps
from vt.validation import AT_LEAST_1, NON_NEGATIVE, check_fields


# Tokens per KV page of chunked scoring; with PAGES_PER_BLOCK (8) pages per attention block, blocks of 512.
SCORING_PAGE = 64


@dataclasses.dataclass(frozen=True)
class ScoringConfig:
    batch_size: Annotated[int, AT_LEAST_1] = 8  # rows per forward pass
    chunk_tokens: Annotated[int, NON_NEGATIVE] = 0  # 0: one forward over the whole row; else KV-cache chunks of this many tokens
    min_bucket: Annotated[int, AT_LEAST_1] = 64  # shortest padded length

    def __post_init__(self):
        check_fields(self)


def _row_nll(model, x_BTD, targets_BT, mask_BT):
    """(masked NLL sum, loss tokens) per row, log-probs in sequence chunks (no float32 [B, T, V] logits)."""
    logp = token_logps(x_BTD, model.head_DV(), targets_BT, vocab_size=model.cfg.vocab_size, dtype=model.cfg.dtype)
    return masked_nll_sum(logp, mask_BT, axis=-1)


def _full(graphdef, state, tokens, targets, mask, segments):
    model = nnx.merge(graphdef, state)
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    x_BTD, _ = model.hidden_states(tokens, positions, segments)
    return _row_nll(model, x_BTD, targets, mask)


def _chunk(graphdef, state, cache, tokens, targets, mask, start):
    model = nnx.merge(graphdef, state)
    B, C = tokens.shape
    positions = start + jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))
    x_BTD, cache = model.hidden_states(tokens, positions, jnp.ones_like(tokens), cache=cache)
    s, n = _row_nll(model, x_BTD, targets, mask)
    return cache, s, n


class Scorer:
    """``Scorer(model, cfg, mesh).nll(prompts, completions) -> np.ndarray`` of S_LP per pair."""

    def __init__(self, model, cfg: ScoringConfig = ScoringConfig(), mesh=None):
        self.graphdef, self.state = nnx.split(model)
        self.model_cfg, self.cfg, self.mesh = model.cfg, cfg, mesh
        self._row_sh = self._kv_sh = None
        if mesh is not None:
            self._row_sh = param_sharding(("batch", None), (cfg.batch_size, 1), mesh, "scoring.batch_size")
            self._kv_sh = dataclasses.replace(PagedKVCache.shardings(self.model_cfg, mesh, self._row_sh),
                                              continues=True)
        self._full = jax.jit(functools.partial(_full, self.graphdef))
        self._chunk = jax.jit(functools.partial(_chunk, self.graphdef), donate_argnums=(1,))
        mc = self.model_cfg
        self._zeros = jax.jit(lambda B, S: PagedKVCache.for_rows(mc, B, S, SCORING_PAGE), static_argnums=(0, 1),
                              **({} if mesh is None else dict(out_shardings=self._kv_sh)))

    def _ctx(self):
        return use_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def _put(self, x: np.ndarray):
        return jnp.asarray(x) if self._row_sh is None else jax.device_put(x, self._row_sh)

    def nll(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> np.ndarray:
        if len(prompts) != len(completions):
            raise VtError(f"scoring: {len(prompts)} prompts but {len(completions)} completions")
        for i, (p, c) in enumerate(zip(prompts, completions)):
            if not p or not c:
                raise VtError(f"scoring: pair {i} has an empty {'prompt' if not p else 'completion'}")
            if len(p) + len(c) > self.model_cfg.max_position_embeddings:
                raise VtError(f"scoring: pair {i} has {len(p) + len(c)} tokens; the model holds "
                              f"{self.model_cfg.max_position_embeddings}")
        order = np.argsort([len(p) + len(c) for p, c in zip(prompts, completions)], kind="stable")
        out = np.zeros(len(prompts), np.float64)
        B = self.cfg.batch_size
        with self._ctx():
            for start in range(0, len(order), B):
                idx = order[start:start + B]
                sums, counts = self._batch([prompts[i] for i in idx], [completions[i] for i in idx])
                out[idx] = sums[:len(idx)] / counts[:len(idx)]
        return out

    def _batch(self, prompts, completions):
        B, cfg = self.cfg.batch_size, self.cfg
        longest = max(len(p) + len(c) - 1 for p, c in zip(prompts, completions))
        T = bucket(longest, cfg.min_bucket)
        if cfg.chunk_tokens:
            T = -(-T // cfg.chunk_tokens) * cfg.chunk_tokens
        T = min(T, self.model_cfg.max_position_embeddings)
        tokens, targets = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
        mask, segments = np.zeros((B, T), np.float32), np.zeros((B, T), np.int32)
        for b, (p, c) in enumerate(zip(prompts, completions)):
            seq = list(p) + list(c)
            L = len(seq) - 1
            tokens[b, :L], targets[b, :L], segments[b, :L] = seq[:-1], seq[1:], 1
            mask[b, len(p) - 1:L] = 1.0  # targets that are completion tokens
        if not cfg.chunk_tokens or cfg.chunk_tokens >= T:
            s, n = self._full(self.state, *map(self._put, (tokens, targets, mask, segments)))
            return np.asarray(s, np.float64), np.asarray(n, np.float64)
        cache = self._zeros(B, T)
        total_s, total_n = 0.0, 0.0
        C = cfg.chunk_tokens
        for c0 in range(0, T, C):
            if not mask[:, c0:].any():
                break
            cache, s, n = self._chunk(self.state, cache, *map(self._put, (tokens[:, c0:c0 + C], targets[:, c0:c0 + C],
                                                                        mask[:, c0:c0 + C])), jnp.int32(c0))
            total_s, total_n = total_s + np.asarray(s, np.float64), total_n + np.asarray(n, np.float64)
        return total_s, total_n
