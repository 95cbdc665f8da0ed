"""AdamW with linear warmup then cosine decay to a floor, global-norm clipping and decoupled weight decay.

Schedule, for step s = 0, 1, ..., total_steps - 1 (the lr used by the update of step s), W warmup steps:
    s <  W:  lr(s) = peak * (s + 1) / W                          (never 0: no wasted first step)
    s >= W:  lr(s) = floor + (peak - floor) * (1 + cos(pi * p)) / 2,   p = min(1, (s - W) / (total - 1 - W))
so lr(W - 1) = lr(W) = peak and the last step, total - 1, runs at exactly `floor` (RECIPE: 5e-5 -> 8e-8).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Annotated

import jax.numpy as jnp
import optax

from vt import VtError
from vt.validation import NON_NEGATIVE, POSITIVE, Range, check_fields


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: Annotated[float, POSITIVE] = 5e-5  # peak learning rate
    final_lr: Annotated[float, NON_NEGATIVE] = 8e-8  # cosine floor, reached on the last step
    warmup_frac: Annotated[float, Range(ge=0, lt=1)] = 0.05  # fraction of total steps spent in linear warmup
    b1: Annotated[float, Range(ge=0, lt=1)] = 0.9
    b2: Annotated[float, Range(ge=0, lt=1)] = 0.999
    eps: Annotated[float, POSITIVE] = 1e-8
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.01  # decoupled (AdamW); matrices only, never norms or biases
    clip_norm: Annotated[float, NON_NEGATIVE] = 1.0  # global-norm gradient clipping; 0 disables

    def __post_init__(self):
        check_fields(self)


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    return max(1, int(round(cfg.warmup_frac * total_steps))) if cfg.warmup_frac > 0 else 0


def lr_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    if total_steps <= 0:
        raise VtError(f"optimizer: total_steps must be positive, got {total_steps}")
    if not 0.0 <= cfg.final_lr <= cfg.lr:
        raise VtError(f"optim.final_lr={cfg.final_lr} must be in [0, optim.lr={cfg.lr}]")
    if not 0.0 <= cfg.warmup_frac < 1.0:
        raise VtError(f"optim.warmup_frac={cfg.warmup_frac} must be in [0, 1)")
    W = warmup_steps(cfg, total_steps)
    decay = max(1, total_steps - 1 - W)
    peak, floor = cfg.lr, cfg.final_lr

    def schedule(step):
        s = jnp.asarray(step, jnp.float32)
        warm = peak * (s + 1.0) / max(W, 1)
        p = jnp.clip((s - W) / decay, 0.0, 1.0)
        cos = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(math.pi * p))
        return jnp.where(s < W, warm, cos)

    return schedule


def _decay_mask(params):
    # Weight decay pulls matrices toward 0; on RMSNorm weights (init 1) and biases it only does harm. The
    # leading layer axis of the stacked decoder weights ("layers.*", [num_layers, ...]) does not count.
    return {k: v.ndim - k.startswith("layers.") >= 2 for k, v in params.items()}


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimiser over a flat dict of parameters ("layers.attn.q_kernel" -> array) and its schedule."""
    schedule = lr_schedule(cfg, total_steps)
    parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                             mask=_decay_mask))
    return optax.chain(*parts), schedule
