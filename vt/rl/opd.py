"""On-policy distillation (OPD): the student samples, a teacher scores every sampled token, and the per-token
reverse KL is that token's advantage in the RL learner's clipped, importance-corrected loss (vt.rl.step).

    A_t = opd.kl_coef * (log p_teacher(y_t) - log p_student(y_t)) + opd.reward_coef * w(q) A_i

log p_student is the sampler's log-prob of the token it drew (`sampler_logp`), w(q) A_i the MGPO advantage of
the sample's verified reward (vt.rl.objectives), discount 0: each token's advantage is its own log-ratio, no
return over later tokens (the reference recipes'). The sum over a completion of -A_t / kl_coef is the sampled
estimate of KL(student || teacher), so the surrogate's gradient is the reverse-KL policy gradient. It reaches the
update through the per-token `adv` row key (vt.rl.batches.learner_batches): rows, packing, micro-batches, the
asynchronous schedule and LoRA are MGPO's. The student's log-probs are those of the distribution it sampled
(at rollout.sampler.temperature), the teacher's at temperature 1: sample at 1, as configs/opd.py does, for the
KL between the two models.

The teachers, and their scoring beside decoding, are vt.rl.teachers'. This module is the config and the
objective's pure functions (host-side, no JAX: config files load OpdConfig).
"""
from __future__ import annotations

import dataclasses
from typing import Annotated, Sequence

import numpy as np

from vt.validation import AT_LEAST_1, NON_NEGATIVE, POSITIVE, check_fields


@dataclasses.dataclass(frozen=True)
class OpdConfig:
    # "" = off (MGPO). A vt checkpoint directory, or an OpenAI-compatible server's URL (http://host:port[/v1]).
    teacher: str = ""
    kl_coef: Annotated[float, NON_NEGATIVE] = 1.0  # weight of the per-token log-ratio in the advantage
    reward_coef: Annotated[float, NON_NEGATIVE] = 0.0  # weight of the MGPO reward advantage (0: pure distillation)
    teacher_batch: Annotated[int, AT_LEAST_1] = 16  # completions per teacher call (a forward pass or a request)
    teacher_dtype: str = "bfloat16"  # a checkpoint teacher's parameter and compute dtype
    # A checkpoint teacher's own devices (one process): the last n, a mesh of their own, off the learner's and the
    # sampler's (rollout.sampler_devices). 0: the learner's mesh (several processes: each one's sampler devices).
    teacher_devices: Annotated[int, NON_NEGATIVE] = 0
    teacher_model: str = ""  # the endpoint's model name ("" = none sent: the server's only model)
    timeout_s: Annotated[float, POSITIVE] = 120.0  # per endpoint request

    def __post_init__(self):
        check_fields(self)

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)


def opd_advantages(teacher_logp, sampler_logp, mask, kl_coef: float, reward_adv=None, reward_coef: float = 0.0):
    """Per token: A_t = kl_coef * (teacher_logp_t - sampler_logp_t) + reward_coef * reward_adv_t, 0 where `mask`
    is 0 (prompt, padding, a tool's tokens). Any shape, all arrays alike; float32."""
    t, s = np.asarray(teacher_logp, np.float64), np.asarray(sampler_logp, np.float64)
    adv = kl_coef * (t - s)
    if reward_coef:
        adv = adv + reward_coef * np.asarray(reward_adv, np.float64)
    return np.where(np.asarray(mask) > 0, adv, 0.0).astype(np.float32)


def completion_slots(rows: dict[str, np.ndarray], prompt_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sample [W, T], j [W, T]): the sample in each slot of build_rows' rows and the index in its completion of
    the slot's target, j = position - (prompt length - 1) (a sample's slots sit at the positions they would have
    alone, shared prompt or not); j = -1 off completion targets."""
    sample = rows["sample"]
    plen = np.asarray(prompt_lengths, np.int64)[np.maximum(sample, 0)]
    j = rows["positions"].astype(np.int64) - (plen - 1)
    return sample, np.where((sample >= 0) & (j >= 0), j, -1)


def teacher_rows(rows: dict[str, np.ndarray], prompt_lengths: np.ndarray, teacher: Sequence[np.ndarray]) -> np.ndarray:
    """The teacher's log-prob of each slot's target [W, T] (float32, 0 off completion targets), from per-sample
    arrays `teacher[i]` [len(completion i)]."""
    sample, j = completion_slots(rows, prompt_lengths)
    flat = np.concatenate([np.asarray(t, np.float32) for t in teacher] + [np.zeros(1, np.float32)])
    starts = np.concatenate([[0], np.cumsum([len(t) for t in teacher])]).astype(np.int64)
    inside = (j >= 0) & (j < (np.diff(starts)[np.maximum(sample, 0)] if len(teacher) else 0))
    return np.where(inside, flat[np.where(inside, starts[np.maximum(sample, 0)] + j, -1)], 0.0).astype(np.float32)


def row_advantages(rows: dict[str, np.ndarray], prompt_lengths: np.ndarray, teacher: Sequence[np.ndarray],
                   cfg: OpdConfig) -> tuple[np.ndarray, dict[str, float]]:
    """OPD's per-token `adv` of build_rows' rows whose `adv` holds the samples' MGPO advantages, and the rows'
    sums for the metrics (reverse KL, teacher and student log-probs, |gap|, tokens; over loss_mask)."""
    t = teacher_rows(rows, prompt_lengths, teacher)
    s, mask = rows["sampler_logp"], rows["loss_mask"]
    adv = opd_advantages(t, s, mask, cfg.kl_coef, rows["adv"], cfg.reward_coef)
    m = mask > 0
    d = (s - t)[m].astype(np.float64)
    sums = {"reverse_kl": d.sum(), "abs_logp_gap": np.abs(d).sum(), "teacher_logp": t[m].sum(),
            "student_logp": s[m].sum(), "tokens": float(m.sum())}
    return adv, sums


def taught_tokens(scored) -> float:
    """The completion tokens the teacher scored for `scored`, a process's batches verified during a step (a tool
    turn's included: the teacher scores whole completions); 0 for None."""
    return float(sum(len(t) for group in scored.teacher or () for t in group)) if scored is not None else 0.0


def teacher_throughput(tokens: Sequence[float], seconds: Sequence[float]) -> dict[str, float]:
    """opd/teacher_tokens: every process's taught_tokens summed (one entry each), and per second of the slowest
    process's scoring (the teachers of several processes score side by side)."""
    total = float(np.sum(np.asarray(tokens, np.float64)))
    return {"opd/teacher_tokens": total, "opd/teacher_tokens_per_s": total / max(float(np.max(seconds)), 1e-9)}


def tokens_to_reach(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The first teacher-token count at which a held-out curve [[tokens, accuracy], ...] reaches `target`; None if
    it never does (the learning check of `vt demo --variant opd`: OPD's vs SFT on the teacher's samples)."""
    return next((float(t) for t, acc in curve if acc >= target), None)
