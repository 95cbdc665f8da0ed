"""Packed vs padded RL updates (issue 18): one step's loss and gradients through the learner's batching
(vt.rl.batches.learner_batches: packed or padded rows, token-budget micro-batches, accumulated gradients)
against the padded objective written from vt.rl.objectives' row functions (clipped_surrogate and aggregate on
one sample per row, the computation the learner did before packing). Shared by the one-device test, the
8-device subprocess and the 2-process worker (tests/scale/packed_rl_worker.py).

The step: Q groups of G samples of a tiny random fp32 model, prompts and completions of varied lengths (some
completions at the row limit), sampler log-probs off the model's so the truncated IS weights vary and some
cap, rewards with partial credit and a verifier failure, Long2Short shaping and a KL term to a second random
model. The KL coefficient is 1: group-centred advantages make J nearly cancel (|J| ~ 1e-3 of its terms), so a
loss of J alone would test float32 rounding, not the layout; the KL term keeps the loss at the scale of its
terms, and the gradients test J's part as well.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vt.config import to_dataclass
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.model.segments import BRANCH
from vt.rl import objectives as obj
from vt.rl.batches import learner_batches, step_advantages
from vt.rl.learner import RLConfig
from vt.rl.rollouts import Scored, batch_length, build_rows
from vt.rl.step import make_rl_step, make_token_logps
from vt.sampling.engine import Sample
from vt.train.optim import make_optimizer
from vt.train.state import ModelDef, train_state_shardings

Q, G, VOCAB = 4, 4, 512
TEMPERATURE, EPS_LOW, EPS_HIGH, IS_CAP, KL_COEF, L2S = 0.8, 0.2, 0.28, 1.5, 1.0, 0.2


def make_scored(seed: int = 0, Q: int = Q, G: int = G) -> Scored:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, rng.integers(3, 10)).tolist() for _ in range(Q)]
    samples = []
    for q in range(Q):
        group = []
        for g in range(G):
            n = int(rng.integers(1, 40)) if (q + g) % 5 else 50  # a few at the longest
            group.append(Sample(rng.integers(1, VOCAB, n).tolist(), (-2.0 - rng.random(n) * 4).tolist(),
                                "length" if n == 50 else "stop"))
        samples.append(group)
    rewards = rng.choice([0.0, 0.5, 1.0], size=(Q, G)).astype(np.float32)
    valid = np.ones((Q, G), bool)
    valid[0, 1] = False
    rewards[~valid] = 0.0
    lengths = np.array([[len(s.completion_ids) for s in g] for g in samples])
    return Scored(prompts, samples, correct=(rewards == 1.0) & valid, rewards=rewards, valid=valid, lengths=lengths,
                  truncated=lengths == 50, domains=["math"] * Q)


def config(aggregation: str, pack: bool, tokens_per_micro_batch: int, mesh=(1, 1, 1), mini_batches: int = 1
           ) -> RLConfig:
    return to_dataclass(RLConfig, {
        "model": {"preset": "tiny"},
        "mgpo": {"aggregation": aggregation, "kl_coef": KL_COEF, "long2short_lambda": L2S, "is_cap": IS_CAP,
                 "eps_low": EPS_LOW, "eps_high": EPS_HIGH, "mini_batches": mini_batches},
        "rollout": {"sampler": {"temperature": TEMPERATURE}},
        "train": {"tokens_per_micro_batch": tokens_per_micro_batch, "pack_rows": pack},
        "mesh": {"data": mesh[0], "fsdp": mesh[1], "tensor": mesh[2]}})


class Setup:
    """A tiny fp32 model (params and a KL reference) on `mesh`, and the learner's jitted RL functions."""

    def __init__(self, mesh):
        cfg = preset("tiny")
        self.md = ModelDef(cfg)
        self.mesh = mesh
        optimizer, schedule = make_optimizer(to_dataclass(RLConfig, {}).optim, 10)
        sh = train_state_shardings(self.md, optimizer, mesh)
        self.optimizer, self.shardings = optimizer, sh
        from vt.checkpoint.params import flat_params
        self.params = flat_params(create_model(cfg, mesh, seed=0))
        self.ref_params = flat_params(create_model(cfg, mesh, seed=1))
        # pi_old: the policy before the step's first update (what later mini-batches see), here another random
        # model, so ratios are far from 1 (clipping on) and J does not cancel to ~0 within groups.
        self.old_params = jax.tree.map(lambda r, p: 0.7 * p + 0.3 * r, self.ref_params, self.params)
        # The learner's programs for plain rows and, as Learner builds them with shared prompts, for branch rows.
        self.programs = {}
        for share, md in ((False, self.md), (True, ModelDef(cfg.replace(segment_branches=True)))):
            self.programs[share] = (make_token_logps(md, sh.params, mesh, TEMPERATURE),
                                    make_rl_step(md, optimizer, schedule, sh, mesh, temperature=TEMPERATURE,
                                                 eps_low=EPS_LOW, eps_high=EPS_HIGH, kl_coef=KL_COEF, is_cap=IS_CAP))
        self.logps, self.step = self.programs[False]

    def learner_update(self, s: Scored, cfg: RLConfig, T: int, share: bool = False):
        """(loss, grads as host arrays, token counts) of the learner's one update on this process's groups."""
        adv, _ = step_advantages(s, cfg.mgpo)
        batches, _, tokens = learner_batches(s, adv, T, 0, cfg, self.mesh, share=share)
        tokens["branches"] = sum(int((np.asarray(gather(mb["segment_ids"])) >= BRANCH).sum()) for mb in batches[0])
        (micro,) = batches
        logps, step = self.programs[share]
        for mb in micro:
            inputs = {k: mb[k] for k in ("input_ids", "targets", "positions", "segment_ids")}
            mb["old_logp"] = logps(self.old_params, inputs)
            mb["ref_logp"] = logps(self.ref_params, inputs)
        grads, loss = step.gradients(self.params, micro)
        return float(gather(loss)), {k: gather(v) for k, v in grads.items()}, tokens, len(micro)


def gather(x) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def padded_reference(md: ModelDef, params: dict, old_params: dict, ref_params: dict, s: Scored, T: int,
                     mask: np.ndarray | None = None) -> dict:
    """aggregation -> (loss, grads) of -J + kl_coef * KL on one sample per row, from objectives' row functions,
    for both aggregations (one compile); params as host arrays, computed on this process's first device.
    `mask` [Y, T]: the tokens J and KL count, in place of build_rows' loss_mask (tests/rl/test_tool_masks.py)."""
    rows = build_rows(s, T, pack=False)
    batch = {k: rows[k] for k in ("input_ids", "targets", "positions", "segment_ids", "loss_mask", "sampler_logp")}
    if mask is not None:
        batch["loss_mask"] = np.asarray(mask, np.float32)
    batch["adv"] = {agg: step_advantages(s, config(agg, False, 1).mgpo)[0].reshape(-1) for agg in obj.AGGREGATIONS}

    def logp_of(p, batch):
        logits = md.apply(p, batch["input_ids"], batch["positions"], batch["segment_ids"]) / TEMPERATURE
        # Full float32 logits on purpose: an independent reference for the learner's chunked log-probs.
        logp_all = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return jnp.take_along_axis(logp_all, batch["targets"][..., None].astype(jnp.int32), axis=-1)[..., 0]

    def loss_fn(p, old_p, ref_p, batch, aggregation):
        logp, old, ref, mask = logp_of(p, batch), logp_of(old_p, batch), logp_of(ref_p, batch), batch["loss_mask"]
        is_w = obj.truncated_importance_weight(old, batch["sampler_logp"], IS_CAP)
        J, _ = obj.clipped_surrogate(logp, old, batch["adv"][aggregation], mask, eps_low=EPS_LOW,
                                     eps_high=EPS_HIGH, aggregation=aggregation, is_weight_YT=is_w)
        kl = obj.aggregate(obj.kl_to_reference(logp, ref), mask, aggregation)
        return -J + KL_COEF * kl

    both = jax.jit(lambda *a: {agg: jax.value_and_grad(loss_fn)(*a, agg) for agg in obj.AGGREGATIONS})
    with jax.default_device(jax.local_devices()[0]):
        out = jax.device_get(both(params, old_params, ref_params, batch))
    return {agg: (float(loss), {k: np.asarray(v) for k, v in grads.items()}) for agg, (loss, grads) in out.items()}


def host_params(params: dict) -> dict:
    return {k: gather(v) for k, v in params.items()}


def compare(what: str, loss, grads, ref_loss, ref_grads, loss_rtol=1e-6, grad_rtol=1e-5) -> list[str]:
    """Mismatches (empty when equal): loss to loss_rtol relative, each gradient tensor to grad_rtol of its
    largest element (a per-element relative bound would flag float reassociation on near-zero entries)."""
    bad = []
    if not abs(loss - ref_loss) <= loss_rtol * abs(ref_loss):
        bad.append(f"{what}: loss {loss!r} vs padded {ref_loss!r} (rel {abs(loss - ref_loss) / abs(ref_loss):.2e})")
    for k, g in ref_grads.items():
        scale = np.abs(g).max()
        err = np.abs(grads[k] - g).max()
        if not (scale > 0 and err <= grad_rtol * scale):
            bad.append(f"{what}: grad {k} max err {err:.3e} vs max |g| {scale:.3e}")
    return bad


def row_length(s: Scored) -> int:
    return batch_length(s, preset("tiny").max_position_embeddings)


def check(mesh_shape=(1, 1, 1), tokens_per_micro_batch: int = 128) -> dict:
    """The learner's update, packed (prompts shared or not) and padded, against the padded reference, for both
    aggregations, on a mesh of this shape over every process's devices (each process feeding its share of the
    groups). Returns the mismatches (`bad`, empty when all agree), the token counts and the micro-batches per
    layout."""
    from vt.rl.hosts import process_slice
    from vt.sharding import MeshConfig, make_mesh
    mesh = make_mesh(MeshConfig(data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2]))
    setup = Setup(mesh)
    everything = make_scored()
    T = row_length(everything)
    mine = process_slice(Q, "Q")
    s = everything.select(range(mine.start, mine.stop))
    reference = padded_reference(setup.md, host_params(setup.params), host_params(setup.old_params),
                                 host_params(setup.ref_params), everything, T)
    out = {"bad": [], "tokens": {}, "micro_batches": {}, "loss": {}}
    for agg in obj.AGGREGATIONS:
        ref_loss, ref_grads = reference[agg]
        for layout, pack, share in (("packed", True, False), ("shared", True, True), ("padded", False, False)):
            name = f"{agg}, {layout}"
            loss, grads, tokens, n = setup.learner_update(s, config(agg, pack, tokens_per_micro_batch, mesh_shape), T,
                                                          share)
            out["bad"] += compare(name, loss, grads, ref_loss, ref_grads)
            out["tokens"][name], out["micro_batches"][name], out["loss"][name] = tokens, n, (loss, ref_loss)
    return out
