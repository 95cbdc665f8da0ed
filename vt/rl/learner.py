"""The MGPO learner (RECIPE stages 3 and 5): on-policy RL with max-entropy prompt weighting.

    result = train_rl(to_dataclass(RLConfig, load_config("configs/mgpo_math.py")), workdir)

One RL step: E prompts -> C samples each (vt.sampling, log-probs kept) -> verifier rewards (vt.rewards; each sample
verified as soon as it finishes, beside decoding, where the reward scores item by item: `rollout.stream_rewards`)
-> optional Long2Short shaping -> advantages w(q) * A_i (vt.rl.objectives) -> pi_old and truncated importance
weights from one learner forward pass -> `mgpo.mini_batches` optimiser updates on the clipped surrogate, over rows
packed at the samples' real lengths (vt.rl.batches) -> the new weights into the sampler (vt.rl.weights).

Which policy version samples which step's batch is vt.rl.schedule's, one pipeline for every rollout.max_staleness
k: k = 0 on-policy; k >= 1 the batch of step s + k is sampled and verified by version s while the device runs
step s's update (verification, judges' round trips and packing overlap device work), the lag corrected by the
truncated importance weight min(pi_old / pi_behaviour, mgpo.is_cap).

Determinism: prompts of step s are a fixed function of (data.seed, s), the sampler's randomness of
(rollout.sampler.seed, s, request, sample) and the schedule of the step, so a run resumed from the checkpoint of
step s (its rollout buffer included) regenerates exactly the rollouts a straight run would have made: params and
rollouts match bitwise on CPU.

Several processes (hosts): each samples, verifies and scores its own E/P prompts on its own devices and feeds
its rows into the global batch (vt.rl.hosts); metrics are gathered from all and written by process 0. Without
dynamic sampling the step's prompts and samples are those of one process (same seeds per prompt and sample).

Workdir: checkpoints/<step>/ (model checkpoints too), metrics.jsonl, tb/, config.json. The loop (set-up, resume,
preemption, cadence, the non-finite halt) is vt.train.loop's, shared with SFT; a step here is one RL step of
`mgpo.mini_batches` optimiser updates. Shape letters as vt.rl.rollouts' (E prompts, C completions per prompt).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np

from vt import VtError
from vt.checkpoint.manager import crash_test_point
from vt.data.tokenizer import load_tokenizer
from vt.distributed import allgather, process_mesh
from vt.rewards.registry import RewardsConfig, make_reward
from vt.rl import objectives as obj
from vt.rl.batches import learner_batches, rollout_metrics, row_length, shares_prompts, step_advantages
from vt.rl.buffer import staleness_metrics
from vt.rl.hosts import process_slice
from vt.rl.opd import OpdConfig, taught_tokens, teacher_throughput
from vt.rl.teachers import StreamingTeacher, make_teacher
from vt.rl.rollouts import TIMES, Scored, drop_trivial, load_records, prompts_for_step, rollout_and_score
from vt.rl.schedule import RolloutSchedule
from vt.rl.step import make_rl_step, make_token_logps
from vt.rl.weights import SamplerWeights, split_devices
from vt.sampling.config import SamplerConfig
from vt.sampling.engine import Engine
from vt.train.loop import (LearnerConfig, LoopConfig, Setup, TrainResult, check_learner, initial_params,
                           resolve_model_config, run_loop, run_workdir)
from vt.train.optim import OptimConfig
from vt.train.state import ModelDef, TrainState
from vt.validation import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, check_fields

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RLDataConfig:
    train: str = ""  # prompt records (vt.data.sources.open_source spec: verl parquet, JSONL, ...)
    eval: str = ""  # held-out prompts for accuracy ("" = none)
    domain: str = ""  # reward domain for every record; "" = each record's own `domain`
    tokenizer: str = ""  # HF tokenizer directory or SentencePiece model
    profile: str = ""  # pass-rate JSONL (`vt profile`): prompts at exactly 0 or 1 are dropped at start
    max_prompt_tokens: Annotated[int, AT_LEAST_1] = 2048
    seed: Annotated[int, NON_NEGATIVE] = 0  # prompt order

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    group_size: Annotated[int, AT_LEAST_1] = 16  # C completions per prompt
    prompts_per_step: Annotated[int, AT_LEAST_1] = 64  # E prompts per RL step
    # The sampler, as vt.sampling configures it. Its temperature is also the learner's: pi is scored at the
    # temperature it was sampled at. Its seed keys the rollouts ((seed, step, request, sample): exact resume)
    # and the mini-batch order; `n` is set per request by the learner (group_size, train.eval_samples).
    sampler: SamplerConfig = SamplerConfig(batch_size=256, max_new_tokens=4096)
    # Verify each sample as soon as its slot finishes, beside decoding (rewards that score item by item: math,
    # code, stem, instruct); False: the whole batch after decoding. The same rewards either way.
    stream_rewards: bool = True
    # k: the rollouts of step s + k are sampled while the learner updates on step s's (one device: the update is
    # dispatched, then the sampler decodes and verifies with its own copy of the weights), so an update may use
    # samples up to k policy versions old, corrected by mgpo.is_cap's truncated importance weight (vt.rl.buffer).
    # 0: on-policy, every rollout sampled by the weights it updates (the synchronous learner). The weight corrects
    # the lag but does not bound the step: watch mismatch_kl (the sampling vs the updating version, per token);
    # growing over a few steps it means the learning rate is too large for k (tests/rl/test_async.py: a run whose
    # mismatch_kl went 0.09 -> 0.76 in three steps collapsed; at half the learning rate it stayed <= 0.1).
    max_staleness: Annotated[int, Range(ge=0, le=16)] = 0
    # n > 0: the sampler decodes on its own sub-mesh of the last n devices (shaped as vt.distributed.process_mesh
    # shapes `mesh` on them) and the learner trains on the others (`mesh` over those); after each update the new
    # weights are copied device to device into the sampler's shardings (with k >= 1 while it decodes the next
    # batch). 0: the sampler shares the learner's devices and mesh. One process only (on several, each process
    # samples on its own devices already: vt.rl.hosts).
    sampler_devices: Annotated[int, NON_NEGATIVE] = 0

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class MgpoConfig:
    gamma: Annotated[float, NON_NEGATIVE] = 1.0  # w(q) = exp(-gamma D_ME); not published: 0 = GRPO
    eps_low: Annotated[float, Range(ge=0, lt=1)] = 0.2  # the ratio's clip floor 1 - eps_low stays positive
    eps_high: Annotated[float, NON_NEGATIVE] = 0.2
    aggregation: str = "seq_mean"  # seq_mean (RECIPE's J) | token_mean
    adv_eps: Annotated[float, POSITIVE] = 1e-6  # keeps a zero-variance group's advantages finite (0)
    std_ddof: Annotated[int, Range(ge=0, le=1)] = 1
    is_cap: Annotated[float, POSITIVE] = 2.0  # C in min(pi_learner / pi_sampler, C)
    kl_coef: Annotated[float, NON_NEGATIVE] = 0.0  # KL to the frozen starting policy; 0 = none (the reports use none)
    long2short_lambda: Annotated[float, NON_NEGATIVE] = 0.0  # > 0 enables Long2Short shaping (RECIPE: 0.2 at the end of math RL)
    # With the sampler's tools: added to a sample's reward per tool call it made (< 0: a penalty); 0 = the verdict only.
    # Within +-1, the span of a verdict: a larger one would outweigh being right.
    tool_call_reward: Annotated[float, Range(ge=-1, le=1)] = 0.0
    mini_batches: Annotated[int, AT_LEAST_1] = 1  # optimiser updates per RL batch
    dynamic_sampling_rounds: Annotated[int, NON_NEGATIVE] = 0  # > 0: replace zero-variance groups with fresh prompts, up to that many extra rounds

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RLTrainConfig(LoopConfig):
    steps: Annotated[int, AT_LEAST_1] = 100
    eval_samples: Annotated[int, AT_LEAST_1] = 4  # samples per held-out prompt (avg@n accuracy at the rollout temperature)
    eval_prompts: Annotated[int, AT_LEAST_1] = 64  # held-out prompts used per evaluation
    # The learner's forward/backward passes run on micro-batches of about this many row slots (rows x row
    # length, over all devices; at least one row per batch shard), gradients accumulated: a fixed memory
    # footprint whatever the step's lengths (a mini-batch's last micro-batch: the rows left; micro_batch_sizes).
    tokens_per_micro_batch: Annotated[int, AT_LEAST_1] = 65536
    pack_rows: bool = True  # first-fit pack samples into rows (segment ids); False: one sample per padded row
    # Packed rows hold a group's prompt once, its samples' completions as branches of it (vt.rl.rollouts.build_rows;
    # the same log-probs and gradients, the prompt computed once instead of once a sample). Off where the attention
    # cannot mask branches (splash, TPU's default: vt.model.attention.supports_branches).
    share_prompts: bool = True


@dataclasses.dataclass(frozen=True)
class RLConfig(LearnerConfig):
    learner: str = "rl"
    data: RLDataConfig = RLDataConfig()
    rollout: RolloutConfig = RolloutConfig()
    mgpo: MgpoConfig = MgpoConfig()
    optim: OptimConfig = OptimConfig(lr=1e-6, final_lr=1e-6, warmup_frac=0.0)
    train: RLTrainConfig = RLTrainConfig()
    rewards: RewardsConfig = RewardsConfig()  # each domain's options: rewards.code.workers, ...
    opd: OpdConfig = OpdConfig()  # on-policy distillation: a teacher's per-token advantages (vt.rl.opd); off by default

    def __post_init__(self):
        check_learner(self, "rl")


class Learner:
    """MGPO: batches from rollouts of the current policy, `mgpo.mini_batches` optimiser updates per step (the
    loop: vt.train.loop)."""

    def __init__(self, cfg: RLConfig, workdir: Path):
        self.cfg, self.workdir = cfg, workdir
        if cfg.mgpo.aggregation not in obj.AGGREGATIONS:
            raise VtError(f"config mgpo.aggregation={cfg.mgpo.aggregation!r}: expected one of {obj.AGGREGATIONS}")
        if not cfg.data.tokenizer:
            raise VtError("config data.tokenizer must be set")
        self.tokenizer = load_tokenizer(cfg.data.tokenizer)
        self.records = load_records(cfg.data.train, "data.train")
        self.dropped = 0
        if cfg.data.profile:
            self.records, self.dropped = drop_trivial(self.records, cfg.data.profile)
            if not self.records:
                raise VtError(f"data.profile={cfg.data.profile}: every prompt has pass rate 0 or 1")
        self.eval_records = load_records(cfg.data.eval, "data.eval") if cfg.data.eval else []
        domains = {cfg.data.domain} if cfg.data.domain else {r.domain for r in self.records + self.eval_records}
        self.rewards = {d: make_reward(d, cfg.rewards) for d in sorted(domains)}

        self.model_cfg = resolve_model_config(cfg.model)
        if self.model_cfg.lora_dropout:
            raise VtError(f"config model.lora_dropout={self.model_cfg.lora_dropout}: the RL learner applies no "
                          "LoRA dropout (its log-probs must be the policy's that sampled); set it to 0")
        learner_devices, sampler_devices, teacher_devices = split_devices(cfg.rollout.sampler_devices,
                                                                          cfg.opd.teacher_devices)
        try:
            self.setup = s = Setup(cfg, workdir, self.model_cfg, cfg.train.steps * cfg.mgpo.mini_batches,
                                   devices=learner_devices)
        except VtError as e:
            if learner_devices is None:
                raise
            raise VtError(f"{e} (config rollout.sampler_devices={cfg.rollout.sampler_devices} and opd.teacher_devices="
                          f"{cfg.opd.teacher_devices} leave the learner {len(learner_devices)})") from None
        self.mesh, self.md = s.mesh, s.md
        # One process: the learner's mesh, or devices of its own (rollout.sampler_devices); several: each process's.
        self.sampler_mesh = (s.mesh if jax.process_count() == 1 and sampler_devices is None
                             else process_mesh(cfg.mesh, sampler_devices))
        mine = process_slice(cfg.rollout.prompts_per_step, "rollout.prompts_per_step")
        self.schedule = RolloutSchedule(cfg.rollout.max_staleness, mine.stop - mine.start,
                                        lambda step, decoded: self.rollout_batch(step, on_decoded=decoded))
        self.sampler_weights = SamplerWeights(self.model_cfg, s.md, self.sampler_mesh, copy=self.schedule.k > 0,
                                              own_devices=cfg.rollout.sampler_devices > 0)
        m, temperature = cfg.mgpo, cfg.rollout.sampler.temperature
        self.share_prompts = shares_prompts(cfg.train, self.model_cfg)
        # The update's and the scoring's model: with shared prompts its attention also masks branch segments
        # (the same parameters; s.md, which the checkpoints describe, stays plain).
        rows_md = ModelDef(self.model_cfg.replace(segment_branches=True)) if self.share_prompts else s.md
        self.logps = make_token_logps(rows_md, s.sh.params, s.mesh, temperature, loss_chunk=cfg.model.loss_chunk)
        self.update = make_rl_step(rows_md, s.optimizer, s.schedule, s.sh, s.mesh,
                                   temperature=temperature, eps_low=m.eps_low, eps_high=m.eps_high,
                                   kl_coef=m.kl_coef, is_cap=m.is_cap, loss_chunk=cfg.model.loss_chunk)
        self.engine = self.ref_params = None  # built by run()
        # OPD's teacher, vocabulary checked before any work; it scores beside decoding on its own devices, else the
        # learner's mesh (idle while a batch decodes at k = 0), on several processes each one's sampler devices
        teacher_mesh = (process_mesh(cfg.mesh, teacher_devices) if teacher_devices else
                        s.mesh if jax.process_count() == 1 else self.sampler_mesh)
        self.teacher = (make_teacher(cfg.opd, self.model_cfg, teacher_mesh, self.tokenizer, cfg.data.tokenizer)
                        if cfg.opd.enabled else None)

    def rollout(self, records, step: int, group_size: int, seed_offset: int = 0, first_request: int = 0,
                on_decoded=None, teach: bool = False) -> Scored:
        """teach: the OPD teacher scores the samples (training batches; not evaluation's)."""
        seed = int(np.random.default_rng([self.cfg.rollout.sampler.seed, seed_offset, step]).integers(2**31))
        teacher = (lambda n: StreamingTeacher(self.teacher, self.cfg.opd.teacher_batch, n)) \
            if teach and self.teacher is not None else None
        return rollout_and_score(self.engine, self.tokenizer, records, self.rewards, group_size=group_size,
                                 seed=seed, max_prompt_tokens=self.cfg.data.max_prompt_tokens,
                                 domain=self.cfg.data.domain, first_request=first_request,
                                 stream=self.cfg.rollout.stream_rewards, on_decoded=on_decoded, teacher=teacher)

    def rollout_batch(self, step: int, on_decoded=None) -> Scored:
        """This process's groups of step `step` (all E on one process, E/P each on P). With dynamic sampling,
        groups whose rewards are all equal (no signal) are replaced by groups of extra prompts, drawn from a
        second deterministic stream keyed by (step, round, process), so a resumed run draws the same ones; if
        the rounds run out the batch is topped up with zero-variance groups (advantage 0), keeping the
        learner's shapes fixed. on_decoded(): called once the engine is no longer needed (the last decoding
        done; the verdicts may still be coming)."""
        cfg = self.cfg
        E, C, rounds = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.mgpo.dynamic_sampling_rounds
        mine = process_slice(E, "rollout.prompts_per_step")
        n, E = len(self.records), mine.stop - mine.start
        idx = prompts_for_step(n, step, cfg.rollout.prompts_per_step, cfg.data.seed)[mine]
        if rounds <= 0:
            return self.rollout([self.records[i] for i in idx], step, C, first_request=mine.start,
                                on_decoded=on_decoded, teach=True)
        scored = self.rollout([self.records[i] for i in idx], step, C, first_request=mine.start, teach=True)
        keep, spare = [scored.select(np.flatnonzero(scored.informative()))], [scored.select(
            np.flatnonzero(~scored.informative()))]
        for r in range(rounds):
            have = sum(len(k.prompts) for k in keep)
            if have >= E:
                break
            stream = (step * rounds + r) * jax.process_count() + jax.process_index()
            idx = prompts_for_step(n, stream, E - have, cfg.data.seed + 1)
            extra = self.rollout([self.records[i] for i in idx], step, C, seed_offset=2 + r, first_request=mine.start,
                                 teach=True)
            keep.append(extra.select(np.flatnonzero(extra.informative())))
            spare.append(extra.select(np.flatnonzero(~extra.informative())))
        if on_decoded is not None:
            on_decoded()
        out = Scored.concat(keep + spare)
        return out.select(range(E))

    def evaluate(self, state: TrainState, step: int) -> float:
        """Share of held-out samples verified correct (reward 1, not partial credit; split over processes)."""
        t = self.cfg.train
        recs = self.eval_records[: t.eval_prompts]
        per = -(-len(recs) // jax.process_count())
        first = min(len(recs), jax.process_index() * per)
        scored = self.rollout(recs[first:first + per], step, t.eval_samples, seed_offset=1, first_request=first)
        total, count = allgather([scored.correct[scored.valid].sum(), scored.valid.sum()]).sum(0)
        return float(total / count) if count else float("nan")

    def train_on(self, state: TrainState, s: Scored) -> tuple[TrainState, dict]:
        """`mini_batches` updates on the rows of every process's groups, each on its micro-batches' summed
        gradients; pi_old and the KL reference are scored for all of them before the first update."""
        return self.finish_update(*self.dispatch_update(state, s))

    def dispatch_update(self, state: TrainState, s: Scored) -> tuple[TrainState, dict, list, dict]:
        """train_on's device work, dispatched and not waited for: (new state, the last mini-batch's metrics and
        every update's `finite`, both on device, host metrics)."""
        m, t = self.cfg.mgpo, self.cfg.train
        adv, w = step_advantages(s, m)
        T = row_length(s, self.model_cfg, t.pack_rows, t.tokens_per_micro_batch, self.mesh, share=self.share_prompts)
        batches, _, tokens = learner_batches(s, adv, T, int(jax.device_get(state.step)), self.cfg, self.mesh,
                                             share=self.share_prompts)
        model_keys = ("input_ids", "targets", "positions", "segment_ids")
        for micro in batches:
            for mb in micro:
                inputs = {k: mb[k] for k in model_keys}
                if m.mini_batches > 1:  # later mini-batches need pi_old from before the first update
                    mb["old_logp"] = self.logps(state.params, inputs)
                if m.kl_coef:
                    mb["ref_logp"] = self.logps(self.ref_params, inputs)
        finite = []
        for micro in batches:
            state, metrics = self.update(state, micro)
            finite.append(metrics["finite"])
        return state, metrics, finite, {"w_mean": float(allgather(w.mean()).mean()), "tokens": tokens, "T": T}

    def finish_update(self, state: TrainState, metrics: dict, finite: list, host: dict) -> tuple[TrainState, dict]:
        """Wait for dispatch_update's metrics: train_on's result."""
        # Metrics describe the last mini-batch, except `finite`: any skipped (non-finite) update halts the run.
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        metrics["finite"] = float(all(bool(f) for f in jax.device_get(finite)))
        # w_mean: every process holds as many groups; tokens: the learner's tokens per pass, real (what tokens/s and
        # MFU count) vs computed
        metrics.update(host["tokens"], w_mean=host["w_mean"], row_length=float(host["T"]))
        return state, metrics

    def throughput(self, metrics: dict, sampled_tokens: int, sample_s: float, train_s: float) -> dict[str, float]:
        """Sampler tokens/s (all processes' completions over the slowest process's sampling time), learner
        tokens/s and MFU of the updates (6N + attention FLOPs per token, per mini-batch pass)."""
        tokens, slowest = allgather([sampled_tokens, sample_s]).T
        out = {"sample_tokens_per_s": float(tokens.sum() / max(slowest.max(), 1e-9))}
        train_tokens, T = metrics["tokens_real"], int(metrics.pop("row_length"))
        out["train_tokens_per_s"] = train_tokens / max(train_s, 1e-9)
        if self.setup.peak_total:
            flops = self.model_cfg.flops_per_token(T) * train_tokens
            out["mfu"] = flops / max(train_s, 1e-9) / self.setup.peak_total
        return out

    def run(self) -> TrainResult:
        cfg = self.cfg
        state, start = self.setup.initial_state(rollouts=self.schedule.buffer,
                                                updates_per_step=cfg.mgpo.mini_batches)
        if cfg.mgpo.kl_coef:
            self.ref_params = jax.tree.map(jnp.copy, self.initial_reference(state))
        self.engine = Engine((self.sampler_weights.md.graphdef, self.sampler_weights(state.params)),
                             cfg.rollout.sampler, mesh=self.sampler_mesh, tokenizer=self.tokenizer)
        self.engine.policy_version = start  # a resumed run's samples record the run's version that began them, not 0
        return run_loop(self.setup, state, start, cfg.train.steps, self.step,
                        evaluate=self.evaluate if self.eval_records else None, eval_key="eval_accuracy",
                        eval_at_start=True, rollouts=self.schedule.buffer, close=self.close_rewards)

    def close_rewards(self):
        for r in (*self.rewards.values(), self.engine):  # the sampler's tool threads too
            r.close()

    def step(self, state: TrainState, step: int) -> tuple[TrainState, dict]:
        """One RL step, at every staleness (vt.rl.schedule): take the step's batch, dispatch its updates, wait
        for them (beside the decoding of the batch ahead), give the sampler the new weights."""
        t0, sampled0 = time.perf_counter(), self.engine.stats.tokens
        used, versions = self.schedule.batch(step)
        t1 = time.perf_counter()
        pending = self.dispatch_update(state, used)
        crash_test_point("rl-update-in-flight", step + 1)  # crash tests: the update dispatched, sampling ahead

        def wait():
            jax.block_until_ready(pending[0].params)
            done = time.perf_counter()
            if self.sampler_weights.own_devices:  # the copy onto the sampler's devices runs while it still decodes
                return done, jax.block_until_ready(self.sampler_weights(pending[0].params))
            return done, None
        done_at, weights = self.schedule.beside_sampling(wait, step)
        state, metrics = self.finish_update(*pending)
        if metrics["finite"]:  # else the update was skipped (the loop halts the run)
            self.engine.update_weights(weights if weights is not None else self.sampler_weights(state.params))
        return state, self.step_metrics(metrics, used, versions, step, (t0, t1, done_at, time.perf_counter()),
                                        self.engine.stats.tokens - sampled0)

    def step_metrics(self, metrics: dict, used: Scored, versions: np.ndarray, step: int, times: tuple,
                     sampled: int) -> dict:
        """The step's metrics beside the update's: time_train_s (from the update's dispatch to its end),
        time_rollout_s (the step's seconds during which some batch was being sampled or verified) and the
        vt.rl.rollouts.TIMES of the batches verified during the step; throughput, the used batch's statistics;
        asynchronous (k >= 1): staleness/<age> (samples of the update by age 0..k), staleness_max,
        sample_version_min, dropped_groups (all so far), time_learner_idle_s and time_sampler_idle_s (the step's
        wall time outside the update's span, and outside the sampler's busy time)."""
        t0, t1, done_at, t_end = times
        fresh, busy = self.schedule.report(t0, t_end)
        spans = {t: (getattr(fresh, t) if fresh is not None else 0.0) for t in TIMES}
        metrics.update(self.throughput(metrics, sampled, spans["time_sample_s"], done_at - t1))
        metrics.update(rollout_metrics(used, sorted(self.rewards)), time_rollout_s=busy, time_train_s=done_at - t1,
                       **spans, prompts_dropped=self.dropped)
        if self.teacher is not None:  # over every process's teacher
            metrics.update(teacher_throughput(*allgather([taught_tokens(fresh), spans["time_teacher_s"]]).T))
        k = self.schedule.k
        if k:
            metrics.update(time_learner_idle_s=(t_end - t0) - (done_at - t1), time_sampler_idle_s=(t_end - t0) - busy,
                           dropped_groups=float(allgather(self.schedule.buffer.dropped_groups).sum()),
                           sample_version_min=float(allgather(versions.min()).min()),
                           **staleness_metrics(allgather(versions).reshape(-1), step, k, self.cfg.rollout.group_size))
        return metrics

    def initial_reference(self, state: TrainState):
        """The frozen KL reference: the starting checkpoint (a random-init run: its params when (re)started)."""
        return initial_params(self.cfg.model, self.model_cfg, self.mesh) if self.cfg.model.init_checkpoint \
            else state.params


def train_rl(cfg: RLConfig, workdir: Path | str) -> TrainResult:
    """Run (or resume) MGPO in `workdir` until `train.steps`, a SIGTERM, or a non-finite step."""
    with run_workdir(cfg, workdir) as workdir:
        return Learner(cfg, workdir).run()
