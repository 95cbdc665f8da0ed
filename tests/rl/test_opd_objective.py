"""On-policy distillation's objective (issue 51) against an independent numpy implementation of its formula:

    A_t = kl_coef * (log p_teacher(y_t) - log p_sampler(y_t)) + reward_coef * w(q) A_i      (discount 0)
    loss = -(1/Y) sum_i (1/|y_i|) sum_t min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t) * min(pi_old / pi_sampler, C)

on hand-built batches (packed rows with shared prompts, several micro-batches) through the learner's own batching
(vt.rl.batches.learner_batches) and update (vt.rl.step). The reference reads a sample's tokens from the rows in
position order, not through vt.rl.opd's slot arithmetic; a forward-KL mutant of the advantage fails the check."""
import jax
import numpy as np
import pytest

from packed_check import make_scored
from vt.config import to_dataclass
from vt.model.config import preset
from vt.model.segments import BRANCH
from vt.model.qwen2 import create_model
from vt.checkpoint.params import flat_params
from vt.rl.batches import learner_batches, step_advantages
from vt.rl.learner import RLConfig
from vt.rl.opd import opd_advantages
from vt.rl.rollouts import build_rows
from vt.rl.step import make_rl_step, make_token_logps
from vt.sharding import make_mesh
from vt.train.optim import make_optimizer
from vt.train.state import ModelDef, train_state_shardings

KL, RC, EPS_LOW, EPS_HIGH, CAP, TEMP, T = 0.7, 0.5, 0.2, 0.28, 1.5, 1.0, 64


def reverse_kl_reference(t, s, mask, reward_adv):
    return np.where(mask > 0, KL * (t - s) + RC * reward_adv, 0.0)


def forward_kl_mutant(t, s, mask, reward_adv):  # KL(teacher || student)'s sampled term: p_t/p_s (log p_t - log p_s)
    return np.where(mask > 0, KL * np.exp(t - s) * (t - s) + RC * reward_adv, 0.0)


@pytest.fixture(scope="module")
def case():
    s = make_scored(seed=3)
    rng = np.random.default_rng(1)
    # teacher log-probs near the sampler's, with a spread so that some ratios clip
    s.teacher = [[np.asarray(x.logprobs, np.float32) + rng.normal(0, 0.8, len(x.logprobs)).astype(np.float32)
                  for x in g] for g in s.samples]
    cfg = to_dataclass(RLConfig, {
        "model": {"preset": "tiny"}, "opd": {"teacher": "unused-here", "kl_coef": KL, "reward_coef": RC},
        "mgpo": {"eps_low": EPS_LOW, "eps_high": EPS_HIGH, "is_cap": CAP},
        "rollout": {"sampler": {"temperature": TEMP}},
        "train": {"tokens_per_micro_batch": 256, "pack_rows": True}})
    mesh = make_mesh(cfg.mesh)
    md = ModelDef(preset("tiny").replace(segment_branches=True))
    adv, _ = step_advantages(s, cfg.mgpo)
    (micro,), _, host = learner_batches(s, adv, T, 0, cfg, mesh, share=True)
    return s, cfg, mesh, md, adv, micro, host


def per_sample(micro, key, s):
    """{sample: values of `key` at its completion targets in position order}, read off the micro-batches' rows
    (build_rows' rows in order, then empty rows; which sample a slot holds: build_rows' `sample`)."""
    rows = {k: np.concatenate([np.asarray(mb[k]) for mb in micro]) for k in ("positions", "loss_mask", key)}
    rows["sample"] = build_rows(s, T, pack=True, share=True)["sample"]
    rows = {k: v[:len(rows["sample"])] for k, v in rows.items()}
    out = {}
    for i in np.unique(rows["sample"][rows["sample"] >= 0]):
        at = (rows["sample"] == i) & (rows["loss_mask"] > 0)
        out[int(i)] = rows[key][at][np.argsort(rows["positions"][at])]
    return out


def reference_advantages(s, adv_EC, fn):
    C = len(s.samples[0])
    return {q * C + g: fn(np.asarray(s.teacher[q][g], np.float64), np.asarray(x.logprobs, np.float64),
                          np.ones(len(x.logprobs)), float(adv_EC[q, g]))
            for q, grp in enumerate(s.samples) for g, x in enumerate(grp)}


def close(ours: dict, ref: dict) -> bool:
    return ours.keys() == ref.keys() and all(np.allclose(ours[i], ref[i], rtol=1e-6, atol=1e-6) for i in ref)


def test_opd_advantages_per_token_match_numpy_and_forward_kl_fails(case):
    s, cfg, _, _, adv, micro, host = case
    assert len(micro) > 1 and any((np.asarray(mb["segment_ids"]) >= BRANCH).any() for mb in micro)  # micro-batched, shared
    ours = per_sample(micro, "adv", s)
    assert close(ours, reference_advantages(s, adv, reverse_kl_reference))
    assert not close(ours, reference_advantages(s, adv, forward_kl_mutant))
    # the pure function itself, and its mask
    t, sm = np.array([-1.0, -2.0, -0.5]), np.array([-1.5, -1.0, -3.0])
    np.testing.assert_allclose(opd_advantages(t, sm, [1, 1, 0], KL), [KL * 0.5, -KL, 0.0], rtol=1e-6)
    # metrics: the sampled reverse KL per completion token, over every sample
    d = np.concatenate([np.asarray(x.logprobs) - s.teacher[q][g] for q, grp in enumerate(s.samples)
                        for g, x in enumerate(grp)])
    np.testing.assert_allclose(host["opd/reverse_kl"], d.mean(), rtol=1e-5)
    np.testing.assert_allclose(host["opd/abs_logp_gap"], np.abs(d).mean(), rtol=1e-5)


def test_opd_loss_matches_numpy(case):
    s, cfg, mesh, md, adv, micro, _ = case
    optimizer, schedule = make_optimizer(cfg.optim, 10)
    sh = train_state_shardings(md, optimizer, mesh)
    params = flat_params(create_model(md.cfg, mesh, seed=0))
    logps = make_token_logps(md, sh.params, mesh, TEMP)
    step = make_rl_step(md, optimizer, schedule, sh, mesh, temperature=TEMP, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                        kl_coef=0.0, is_cap=CAP)
    rng = np.random.default_rng(2)
    for mb in micro:  # pi_old off the current policy: ratios away from 1, some clipped
        lp = np.asarray(logps(params, {k: mb[k] for k in ("input_ids", "targets", "positions", "segment_ids")}))
        mb["logp"] = lp
        mb["old_logp"] = jax.device_put((lp + rng.normal(0, 0.3, lp.shape)).astype(np.float32), mb["adv"].sharding)
    _, loss = step.gradients(params, [{k: v for k, v in mb.items() if k != "logp"} for mb in micro])
    logp, old = per_sample(micro, "logp", s), per_sample(micro, "old_logp", s)
    C, Y = len(s.samples[0]), sum(len(g) for g in s.samples)

    def loss_of(fn):
        A = reference_advantages(s, adv, fn)
        total = 0.0
        for q, grp in enumerate(s.samples):
            for g, x in enumerate(grp):
                i = q * C + g
                rho = np.exp(logp[i].astype(np.float64) - old[i])
                isw = np.minimum(np.exp(old[i].astype(np.float64) - np.asarray(x.logprobs)), CAP)
                per = np.minimum(rho * A[i], np.clip(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * A[i]) * isw
                total += per.sum() / len(per)
        return -total / Y
    np.testing.assert_allclose(float(loss), loss_of(reverse_kl_reference), rtol=1e-4)
    assert not np.isclose(float(loss), loss_of(forward_kl_mutant), rtol=1e-2)
