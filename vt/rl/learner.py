"""The MGPO learner (RECIPE stages 3 and 5): on-policy RL with max-entropy prompt weighting.

    result = train_rl(to_dataclass(RLConfig, load_config("configs/mgpo_math.py")), workdir)

One RL step: E prompts -> C samples each from the current policy (vt.sampling, log-probs kept) -> verifier
rewards (vt.rewards; each sample verified as soon as its slot finishes, beside decoding, when its reward scores
item by item: `rollout.stream_rewards`) -> optional Long2Short shaping -> advantages w(q) * A_i
(vt.rl.objectives) -> pi_old and truncated importance weights from one learner forward pass -> `mini_batches`
optimiser updates on the clipped surrogate -> the new weights pushed into the sampler in place.

The learner computes on the samples' real lengths: prompt + completion rows first-fit packed into rows of a
length chosen per step (`row_length`: the bucketed longest sample or a few buckets more, by the slots its
micro-batches compute; segment ids, positions restarting per sample), a group's prompt held once per row with its
completions as branches of it (`train.share_prompts`, vt.model.segments), and every pass (pi_old, the
KL reference, each update) runs over micro-batches of about `train.tokens_per_micro_batch` slots with the
gradients summed, so one long sample among hundreds of short ones neither pads them all nor grows the
memory a pass needs. Per-token objective weights make the sums the same per-sequence (or per-token) mean
as one padded row per sample; metrics tokens_real / tokens_computed / padding_fraction count the waste.

Determinism: prompts of step s are a fixed function of (data.seed, s) and the sampler's randomness a fixed
function of (rollout.sampler.seed, s, request, sample), so a run resumed from the checkpoint of step s regenerates
exactly the rollouts a straight run would have made: params and rollouts match bitwise on CPU.

Asynchronous RL (rollout.max_staleness = k >= 1, Learner.async_step_fn): the rollouts of step s + k are sampled
and verified by the sampler's own copy of the weights of version s while the device runs step s's update, so
host work (verification, judges' HTTP round trips, packing) overlaps device work. Samples keep the version that
generated them (vt.rl.buffer: whole groups, stale ones dropped and counted, the buffer saved with each
checkpoint) and their behaviour log-probs; the update's truncated importance weight min(pi_old / pi_behaviour,
mgpo.is_cap) corrects for the lag. The schedule is a function of the step: resume stays exact.

The sampler's own devices (rollout.sampler_devices = n, one process): the engine decodes on a sub-mesh of the
last n devices, the learner trains on the others; after each update the new weights are copied device to
device onto the engine's shardings (with k >= 1 as soon as the update is done, while the sampler still decodes
the batch ahead). The same schedule and values as the shared devices: only where the arrays live differs.

Several processes (hosts): each samples, verifies and scores its own E/P prompts on its own devices and feeds
its rows into the global batch (vt.rl.hosts); metrics are gathered from all and written by process 0. Without
dynamic sampling the step's prompts and samples are those of one process (same seeds per prompt and sample).

Workdir: checkpoints/<step>/ (model checkpoints too), metrics.jsonl, tb/, config.json. The loop (set-up, resume,
preemption, cadence, the non-finite halt) is vt.train.loop's, shared with SFT; a step here is one RL step of
`mgpo.mini_batches` optimiser updates.

RL shape letters (distinct from the model's B, T, N, G, ... of vt.model.qwen2): E prompts, C completions
(responses) per prompt, Y = E * C completions, T tokens per row.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Annotated, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vt import VtError
from vt.checkpoint.manager import CheckpointConfig, crash_test_point
from vt.data.curriculum import load_pass_rates
from vt.data.packing import packed_rows
from vt.data.sources import Malformed, open_source
from vt.data.tokenizer import load_tokenizer
from vt.distributed import allgather, global_batch, process_mesh
from vt.model.attention import resolve, supports_branches
from vt.model.lora import base_config, merged_params
from vt.rewards.registry import RewardsConfig, make_reward
from vt.rewards.shaping import long2short
from vt.rewards.streaming import busy_seconds
from vt.rl import objectives as obj
from vt.rl.buffer import RolloutBuffer, staleness_metrics
from vt.rl.hosts import LocalReplicas, process_slice
from vt.rl.rollouts import (TIMES, Scored, batch_length, bucket_length, build_rows, per_token, rollout_and_score,
                             row_units, unit_lengths)
from vt.rl.step import ROW_KEYS, make_rl_step, make_token_logps, row_sharding
from vt.sampling.config import SamplerConfig
from vt.sampling.engine import Engine
from vt.sharding import MeshConfig, state_shardings
from vt.tracking import LoggingConfig
from vt.train.loop import (ModelSection, Setup, TrainResult, check_learner, initial_params, resolve_model_config,
                           run_loop, run_workdir)
from vt.train.optim import OptimConfig
from vt.train.state import ModelDef, TrainState
from vt.validation import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, check_fields

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RLData:
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
class Rollout:
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
class MgpoSection:
    gamma: Annotated[float, NON_NEGATIVE] = 1.0  # w(q) = exp(-gamma D_ME); not published: 0 = GRPO
    eps_low: Annotated[float, Range(ge=0, lt=1)] = 0.2  # the ratio's clip floor 1 - eps_low stays positive
    eps_high: Annotated[float, NON_NEGATIVE] = 0.2
    aggregation: str = "seq_mean"  # seq_mean (RECIPE's J) | token_mean
    adv_eps: Annotated[float, POSITIVE] = 1e-6  # keeps a zero-variance group's advantages finite (0)
    std_ddof: Annotated[int, Range(ge=0, le=1)] = 1
    is_cap: Annotated[float, POSITIVE] = 2.0  # C in min(pi_learner / pi_sampler, C)
    kl_coef: Annotated[float, NON_NEGATIVE] = 0.0  # KL to the frozen starting policy; 0 = none (the reports use none)
    long2short_lambda: Annotated[float, NON_NEGATIVE] = 0.0  # > 0 enables Long2Short shaping (RECIPE: 0.2 at the end of math RL)
    mini_batches: Annotated[int, AT_LEAST_1] = 1  # optimiser updates per RL batch
    dynamic_sampling_rounds: Annotated[int, NON_NEGATIVE] = 0  # > 0: replace zero-variance groups with fresh prompts, up to that many extra rounds

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RLTrain:
    steps: Annotated[int, AT_LEAST_1] = 100
    # Steps between held-out accuracy evaluations, which also run at the start and at the last step; 0 = only
    # at the start and at the last step (data.eval set).
    eval_every: Annotated[int, NON_NEGATIVE] = 0
    eval_samples: Annotated[int, AT_LEAST_1] = 4  # samples per held-out prompt (avg@n accuracy at the rollout temperature)
    eval_prompts: Annotated[int, AT_LEAST_1] = 64  # held-out prompts used per evaluation
    progress: bool = True
    peak_flops: Annotated[float, NON_NEGATIVE] = 0.0  # per device, for MFU; 0 = known accelerators only
    # The learner's forward/backward passes run on micro-batches of about this many row slots (rows x row
    # length, over all devices; at least one row per batch shard), gradients accumulated: a fixed memory
    # footprint whatever the step's lengths (a mini-batch's last micro-batch: the rows left; micro_batch_sizes).
    tokens_per_micro_batch: Annotated[int, AT_LEAST_1] = 65536
    pack_rows: bool = True  # first-fit pack samples into rows (segment ids); False: one sample per padded row
    # Packed rows hold a group's prompt once, its samples' completions as branches of it (vt.rl.rollouts.build_rows;
    # the same log-probs and gradients, the prompt computed once instead of once a sample). Off where the attention
    # cannot mask branches (splash, TPU's default: vt.model.attention.supports_branches).
    share_prompts: bool = True
    compilation_cache: str = ""  # JAX persistent compilation cache directory ("" = off; vt.distributed)

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RLConfig:
    learner: str = "rl"  # which learner reads this config (`vt train` dispatches on it)
    model: ModelSection = ModelSection()
    data: RLData = RLData()
    rollout: Rollout = Rollout()
    mgpo: MgpoSection = MgpoSection()
    mesh: MeshConfig = MeshConfig()
    optim: OptimConfig = OptimConfig(lr=1e-6, final_lr=1e-6, warmup_frac=0.0)
    train: RLTrain = RLTrain()
    checkpoint: CheckpointConfig = CheckpointConfig()
    rewards: RewardsConfig = RewardsConfig()  # each domain's options: rewards.code.workers, ...
    logging: LoggingConfig = LoggingConfig()

    def __post_init__(self):
        check_learner(self, "rl")


def load_records(spec: str, where: str):
    source = open_source(spec)
    records = [source[i] for i in range(len(source))]
    bad = [r for r in records if isinstance(r, Malformed)]
    if bad:
        raise VtError(f"{where}: {len(bad)} malformed record(s), first at {bad[0].where}: {bad[0].reason}")
    if not records:
        raise VtError(f"{where}={spec!r}: no records")
    return records


def drop_trivial(records, profile_path: str):
    """RECIPE: before an RL phase, drop prompts the starting checkpoint always or never solves."""
    rates = load_pass_rates(profile_path)
    kept = [r for r in records if r.prompt_id in rates and 0.0 < rates[r.prompt_id].pass_rate < 1.0]
    return kept, len(records) - len(kept)


def prompts_for_step(n_records: int, step: int, E: int, seed: int) -> np.ndarray:
    """Indices of step `step`'s prompts: consecutive slices of per-epoch permutations (deterministic)."""
    start = step * E
    out = []
    while len(out) < E:
        epoch, offset = divmod(start + len(out), n_records)
        perm = np.random.default_rng([seed, epoch]).permutation(n_records)
        out.extend(perm[offset: offset + E - len(out)].tolist())
    return np.asarray(out)


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
        learner_devices, sampler_devices = split_devices(cfg.rollout.sampler_devices)
        try:
            self.setup = s = Setup(cfg, workdir, self.model_cfg, cfg.train.steps * cfg.mgpo.mini_batches,
                                   devices=learner_devices)
        except VtError as e:
            if learner_devices is None:
                raise
            raise VtError(f"{e} (config rollout.sampler_devices={cfg.rollout.sampler_devices} leaves the learner "
                          f"{len(learner_devices)})") from None
        self.mesh, self.md = s.mesh, s.md
        # One process: the sampler shares the learner's mesh, or has its own devices (rollout.sampler_devices).
        # Several: each samples on its own devices.
        self.sampler_mesh = (s.mesh if jax.process_count() == 1 and sampler_devices is None
                             else process_mesh(cfg.mesh, sampler_devices))
        self.replicas = None if jax.process_count() == 1 else LocalReplicas(self.sampler_mesh)
        self._sampler_sh = None
        m, temperature = cfg.mgpo, cfg.rollout.sampler.temperature
        self.share_prompts = shares_prompts(cfg.train, self.model_cfg)
        # The update's and the scoring's model: with shared prompts its attention also masks branch segments
        # (the same parameters; s.md, which the checkpoints describe, stays plain).
        rows_md = ModelDef(self.model_cfg.replace(segment_branches=True)) if self.share_prompts else s.md
        self.logps = make_token_logps(rows_md, s.sh.params, s.mesh, temperature, loss_chunk=cfg.model.loss_chunk)
        self.update = make_rl_step(rows_md, s.optimizer, s.schedule, s.sh, s.mesh,
                                   temperature=temperature, eps_low=m.eps_low, eps_high=m.eps_high,
                                   kl_coef=m.kl_coef, is_cap=m.is_cap, loss_chunk=cfg.model.loss_chunk)
        self.engine = None
        self.ref_params = None
        # The sampler decodes with the adapters merged into a copy of the base weights, made per weight update:
        # the plain model's decode step, no adapter matmuls per token. bench/lora_rollout.py on a (loaded) CPU,
        # small preset, rank 16: merged and applied level (0.96x); not yet measured on an accelerator.
        self.sampler_md = ModelDef(base_config(self.model_cfg)) if self.model_cfg.lora_rank else self.md
        self._merge = jax.jit(lambda p: merged_params(p, self.model_cfg))

    @property
    def own_sampler_devices(self) -> bool:
        """The sampler decodes on devices the learner does not train on (rollout.sampler_devices)."""
        return self.cfg.rollout.sampler_devices > 0

    def sampler_weights(self, params):
        """The learner's params as the sampler's nnx.State: the same arrays on one process; a device-to-device
        copy laid out as the sampler's sub-mesh wants (its shardings) with rollout.sampler_devices; a full local
        copy per process on several (a collective: every process calls this at the same point). Dispatched,
        not waited for. With LoRA, the adapters merged into the base weights first."""
        if self.model_cfg.lora_rank:
            params = self._merge(params)
        state = nnx.state(self.sampler_md.bind(params))
        if self.replicas is None and not self.own_sampler_devices:
            return state
        if self._sampler_sh is None:
            self._sampler_sh = state_shardings(state, self.sampler_mesh)
        if self.replicas is None:
            return jax.device_put(state, self._sampler_sh)
        return self.replicas(state, self._sampler_sh)

    def rollout(self, records, step: int, group_size: int, seed_offset: int = 0, first_request: int = 0,
                on_decoded=None) -> Scored:
        seed = int(np.random.default_rng([self.cfg.rollout.sampler.seed, seed_offset, step]).integers(2**31))
        return rollout_and_score(self.engine, self.tokenizer, records, self.rewards, group_size=group_size,
                                 seed=seed, max_prompt_tokens=self.cfg.data.max_prompt_tokens,
                                 domain=self.cfg.data.domain, first_request=first_request,
                                 stream=self.cfg.rollout.stream_rewards, on_decoded=on_decoded)

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
                                on_decoded=on_decoded)
        scored = self.rollout([self.records[i] for i in idx], step, C, first_request=mine.start)
        keep, spare = [scored.select(np.flatnonzero(scored.informative()))], [scored.select(
            np.flatnonzero(~scored.informative()))]
        for r in range(rounds):
            have = sum(len(k.prompts) for k in keep)
            if have >= E:
                break
            stream = (step * rounds + r) * jax.process_count() + jax.process_index()
            idx = prompts_for_step(n, stream, E - have, cfg.data.seed + 1)
            extra = self.rollout([self.records[i] for i in idx], step, C, seed_offset=2 + r, first_request=mine.start)
            keep.append(extra.select(np.flatnonzero(extra.informative())))
            spare.append(extra.select(np.flatnonzero(~extra.informative())))
        if on_decoded is not None:
            on_decoded()
        out = Scored.concat(keep + spare)
        return out.select(range(E))

    def evaluate(self, state: TrainState, step: int) -> float:
        """Mean verified reward over the held-out prompts (split over processes in consecutive runs)."""
        t = self.cfg.train
        recs = self.eval_records[: t.eval_prompts]
        per = -(-len(recs) // jax.process_count())
        first = min(len(recs), jax.process_index() * per)
        scored = self.rollout(recs[first:first + per], step, t.eval_samples, seed_offset=1, first_request=first)
        total, count = allgather([scored.rewards[scored.valid].sum(), scored.valid.sum()]).sum(0)
        return float(total / count) if count else float("nan")

    def train_on(self, state: TrainState, s: Scored) -> tuple[TrainState, dict]:
        """`mini_batches` updates on the rows of every process's groups, each on its micro-batches' summed
        gradients; pi_old and the KL reference are scored for all of them before the first update."""
        return self.finish_update(*self.dispatch_update(state, s))

    def dispatch_update(self, state: TrainState, s: Scored) -> tuple[TrainState, dict, list, dict]:
        """train_on's device work, dispatched and not waited for: (new state, the last mini-batch's metrics and
        every update's `finite`, both on device, host metrics)."""
        m = self.cfg.mgpo
        adv, w = step_advantages(s, m)
        t = self.cfg.train
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
        w_mean, tokens, T = host["w_mean"], host["tokens"], host["T"]
        # Metrics describe the last mini-batch, except `finite`: any skipped (non-finite) update halts the run.
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        metrics["finite"] = float(all(bool(f) for f in jax.device_get(finite)))
        metrics["w_mean"] = w_mean  # every process holds as many groups
        metrics.update(tokens)  # the learner's tokens per pass: real (what tokens/s and MFU count) vs computed
        metrics["row_length"] = float(T)
        return state, metrics

    def throughput(self, metrics: dict, sampled_tokens: int, sample_s: float, train_s: float) -> dict[str, float]:
        """Sampler tokens/s (all processes' completions over the slowest process's sampling time), learner
        tokens/s and MFU of the updates (6N + attention FLOPs per token, per mini-batch pass)."""
        tokens, slowest = allgather([sampled_tokens, sample_s]).T
        out = {"sample_tokens_per_s": float(tokens.sum() / max(slowest.max(), 1e-9))}
        train_tokens = metrics["tokens_real"]
        T = int(metrics.pop("row_length"))
        out["train_tokens_per_s"] = train_tokens / max(train_s, 1e-9)
        if self.setup.peak_total:
            flops = self.model_cfg.flops_per_token(T) * train_tokens
            out["mfu"] = flops / max(train_s, 1e-9) / self.setup.peak_total
        return out

    def run(self) -> TrainResult:
        cfg = self.cfg
        k = cfg.rollout.max_staleness
        buffer = RolloutBuffer(k) if k else None  # restored with the checkpoint (its data-iterator state)
        if buffer is None:
            refuse_asynchronous_checkpoint(self.setup.ckpt)
        state, start = self.setup.initial_state(buffer, updates_per_step=cfg.mgpo.mini_batches)
        if cfg.mgpo.kl_coef:
            self.ref_params = jax.tree.map(jnp.copy, self.initial_reference(state))
        self.engine = Engine((self.sampler_md.graphdef, self.sampler_weights(self.sampler_copy(state.params))),
                             cfg.rollout.sampler, mesh=self.sampler_mesh, tokenizer=self.tokenizer)

        def step_fn(state, step):
            t0, sampled0 = time.perf_counter(), self.engine.stats.tokens
            scored = self.rollout_batch(step)
            t1 = time.perf_counter()
            state, metrics = self.train_on(state, scored)
            if metrics["finite"]:  # else the update was skipped (the loop halts the run)
                self.engine.update_weights(self.sampler_weights(state.params))
            t2 = time.perf_counter()
            metrics.update(self.throughput(metrics, self.engine.stats.tokens - sampled0, scored.time_sample_s,
                                           t2 - t1))
            # time_train_s is the update (train_on and the new weights into the sampler); the rollout's timings
            # are vt.rl.rollouts.TIMES (sample, the wait for verdicts after it, verify, their overlap).
            metrics.update(rollout_metrics(scored, sorted(self.rewards)), time_rollout_s=t1 - t0,
                           time_train_s=t2 - t1, **{t: getattr(scored, t) for t in TIMES},
                           prompts_dropped=self.dropped)
            return state, metrics

        def close():
            for r in self.rewards.values():
                r.close()

        return run_loop(self.setup, state, start, cfg.train.steps,
                        self.async_step_fn(buffer) if buffer is not None else step_fn,
                        evaluate=self.evaluate if self.eval_records else None, eval_key="eval_accuracy",
                        eval_at_start=True, data_iterator=buffer, close=close)

    def sampler_copy(self, params):
        """The params the sampler is given. Synchronous: the learner's own arrays (the update that donates them
        runs after the sampling that reads them). Asynchronous: a copy, which the sampler decodes with while
        the update consumes (donates) the learner's; with the sampler's own devices the move onto them
        (sampler_weights) is that copy already."""
        if self.cfg.rollout.max_staleness and not self.own_sampler_devices:
            return jax.tree.map(jnp.copy, params)
        return params

    def async_step_fn(self, buffer: RolloutBuffer):
        """The step of rollout.max_staleness = k >= 1. Step s (the learner at version s, i.e. after s steps):
            start sampling and verifying the batch of step s + k with the sampler's copy of version s, on a
            thread of its own (decoding on the device, verification on the host);
            take the batch of step s from the buffer (sampled at version s - k or, the first k steps of a fresh
            run, at version 0), waiting for its verdicts if they are still coming in;
            dispatch its updates (not waited for), which the device runs between the decode calls;
            wait for the update and for the decoding of batch s + k (not its verification, which goes on beside
            the next step's decoding), give the sampler a copy of version s + 1.
        So no update uses a sample more than k versions old (the buffer checks and drops older groups), and the
        schedule (which version samples which step's prompts, with which seeds) is a function of the step
        alone: a run resumed from a checkpoint (which holds the buffer's groups and versions) continues as an
        uninterrupted one. Beside the synchronous step's metrics: staleness/<age> (samples of the update by age
        0..k), staleness_max, sample_version_min, dropped_groups (all so far), time_learner_idle_s and
        time_sampler_idle_s (the step's wall time outside the update's dispatch-to-done span, and outside
        the spans in which some batch is being sampled or verified); time_rollout_s is the latter's busy time."""
        cfg = self.cfg
        k, E, C = cfg.rollout.max_staleness, cfg.rollout.prompts_per_step, cfg.rollout.group_size
        mine = process_slice(E, "rollout.prompts_per_step")
        E_mine = mine.stop - mine.start  # this process's groups per step

        spans: list[list[float]] = []  # [start, end or inf] of every batch's sampling + verification
        unreported: list[Scored] = []  # batches verified since the last metrics line (for their TIMES)

        def sample(step: int, version: int) -> Scored:
            spans.append([time.perf_counter(), math.inf])
            scored = self.rollout_batch(step)
            spans[-1][1] = time.perf_counter()
            buffer.put(scored, version)
            unreported.append(scored)
            return scored

        def sample_ahead(step: int, version: int) -> _Ahead:
            span = [time.perf_counter(), math.inf]
            spans.append(span)

            def job(decoded):
                try:
                    scored = self.rollout_batch(step, on_decoded=decoded)
                    unreported.append(scored)
                    return scored
                finally:
                    span[1] = time.perf_counter()
            ahead = _Ahead(job)
            buffer.put_pending(ahead.result, version, E_mine)
            return ahead

        def step_fn(state, step):
            t0, sampled0 = time.perf_counter(), self.engine.stats.tokens
            # A fresh run (or one resumed without the batches of its next steps) samples what is missing now,
            # with the current weights: the first k steps' batches, at version `step`.
            for j in range(step + len(buffer) // E_mine, step + k):
                sample(j, step)
            # The batch of step s + k, sampled by version s (the engine's weights now) in the background: its
            # decoding overlaps the verification of the batches before it (below, the take waits for step s's),
            # the update, and host work; its own verification may go on into the next step (a checkpoint waits
            # for it: RolloutBuffer.get_state). Also at the run's last steps (k batches unused unless the run is
            # continued), so that the checkpoint holds what a longer run (train.steps raised, then resumed)
            # would have used; a resume stays exact.
            ahead = sample_ahead(step + k, step)
            taken = buffer.take(E_mine, step)
            if taken is None:  # groups were dropped as stale: sample the step's batch now, on-policy
                ahead.wait_decoded()  # one decoding at a time
                sample(step, step)
                taken = buffer.take(E_mine, step)
            used, versions = taken
            t1 = time.perf_counter()
            pending = self.dispatch_update(state, used)
            crash_test_point("rl-update-in-flight", step + 1)  # crash tests: the update dispatched, sampling ahead
            done_at, copied = [], []

            def wait_for_update():
                jax.block_until_ready(pending[0].params)
                done_at.append(time.perf_counter())
                if self.own_sampler_devices:  # the copy onto the sampler's devices runs while it still decodes
                    copied.append(jax.block_until_ready(self.sampler_weights(pending[0].params)))
            waiter = threading.Thread(target=wait_for_update, daemon=True)
            waiter.start()
            ahead.wait_decoded()  # the engine takes new weights only between batches
            crash_test_point("rl-sampled-ahead", step + 1)  # crash tests: the next batch sampled, not yet saved
            waiter.join()
            state, metrics = self.finish_update(*pending)
            if metrics["finite"]:
                self.engine.update_weights(copied[0] if copied else
                                           self.sampler_weights(self.sampler_copy(state.params)))
            t3 = time.perf_counter()
            done = unreported[:]  # the batch ahead's thread may append to it meanwhile
            del unreported[:len(done)]
            fresh = Scored.concat(done) if done else None
            times = {t: (getattr(fresh, t) if fresh is not None else 0.0) for t in TIMES}
            metrics.update(self.throughput(metrics, self.engine.stats.tokens - sampled0, times["time_sample_s"],
                                           done_at[0] - t1))
            # The sampler is busy while some batch is being sampled or verified (clipped to this step).
            busy_sampling = busy_seconds([(max(a, t0), min(b, t3)) for a, b in spans])
            spans[:] = [x for x in spans if x[1] > t3]
            metrics.update(rollout_metrics(used, sorted(self.rewards)), time_rollout_s=busy_sampling,
                           time_train_s=done_at[0] - t1, **times, prompts_dropped=self.dropped,
                           time_learner_idle_s=(t3 - t0) - (done_at[0] - t1),
                           time_sampler_idle_s=(t3 - t0) - busy_sampling,
                           dropped_groups=float(allgather(buffer.dropped_groups).sum()),
                           sample_version_min=float(allgather(versions.min()).min()),
                           **staleness_metrics(allgather(versions).reshape(-1), step, k, C))
            return state, metrics

        return step_fn

    def initial_reference(self, state: TrainState):
        """The frozen KL reference: the starting checkpoint (a random-init run: its params when (re)started)."""
        return initial_params(self.cfg.model, self.model_cfg, self.mesh) if self.cfg.model.init_checkpoint \
            else state.params


class _Ahead:
    """A batch sampled and verified on a thread of its own: `job(decoded)` returns its Scored and calls decoded()
    once it no longer needs the engine."""

    def __init__(self, job: Callable[[Callable[[], None]], Scored]):
        self._decoded = threading.Event()
        self._out: list = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(job,), daemon=True, name="vt-sample-ahead")
        self._thread.start()

    def _run(self, job) -> None:
        try:
            self._out.append(job(self._decoded.set))
        except BaseException as e:  # noqa: BLE001 - raised where the batch is waited for
            self._error.append(e)
        finally:
            self._decoded.set()

    def wait_decoded(self) -> None:
        self._decoded.wait()
        if self._error:
            self._thread.join()
            raise self._error[0]

    def result(self) -> Scored:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._out[0]


def split_devices(sampler_devices: int) -> tuple[list | None, list | None]:
    """(the learner's devices, the sampler's): all and None (shared) for 0, else the first and the last n."""
    if not sampler_devices:
        return None, None
    devices = jax.devices()
    if jax.process_count() > 1:
        raise VtError(f"config rollout.sampler_devices={sampler_devices}: one process only (on {jax.process_count()} "
                      "processes each samples on its own devices already); set it to 0")
    if sampler_devices >= len(devices):
        raise VtError(f"config rollout.sampler_devices={sampler_devices}: must leave the learner at least one of the "
                      f"{len(devices)} devices")
    return devices[:-sampler_devices], devices[-sampler_devices:]


def step_advantages(s: Scored, m: MgpoSection) -> tuple[np.ndarray, np.ndarray]:
    """(w(q) * A_i [E, C], w(q) [E]) of a step's groups, from the rewards (Long2Short-shaped when enabled)."""
    adv, w = _advantages(s.rewards, s.correct, s.lengths, s.valid, m.long2short_lambda, m.gamma, m.adv_eps,
                         m.std_ddof)
    return np.asarray(adv), np.asarray(w)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _advantages(rewards, correct, lengths, valid, long2short_lambda, gamma, eps, ddof):
    # One compiled program per run (its [E, C] shapes are fixed): dispatched op by op, these ~40 tiny jnp ops
    # cost ~7 ms of host time per RL step (cProfile of the toy bench), as much as the update's own dispatch.
    if long2short_lambda > 0:
        rewards = long2short(jnp.where(correct, 1.0, rewards), lengths, long2short_lambda)
    return obj.mgpo_advantages(rewards, correct, gamma, eps, ddof, valid)


def shares_prompts(train: RLTrain, model_cfg) -> bool:
    """Do the learner's rows hold a group's prompt once (train.share_prompts, packed rows, an attention
    implementation that masks branches: vt.model.attention.supports_branches)?"""
    impl = resolve(model_cfg.attention_impl, model_cfg.dtype)
    return train.share_prompts and train.pack_rows and supports_branches(impl)


def row_length(s: Scored, model_cfg, pack: bool, tokens_per_micro_batch: int, mesh, share: bool = False,
               candidates: int = 3) -> int:
    """The step's row length T, the same on every process: at least every process's longest sample, bucketed
    (batch_length). Packed, the cheapest of the next `candidates` buckets (cut at the context length; with
    `share`, three more: rows long enough to hold a group's prompt once with several of its completions) by the
    FLOPs of the rows its micro-batches compute (micro_batch_sizes: first-fit's rows of build_rows' units, the
    last micro-batch's rounded up to a compiled shape) x T x FLOPs per token at T, the shortest on a tie; the
    step's rows are costed as one mini-batch. bench/rl_step.py's toy step unshared: 125 samples of 15 slots and
    three of 16-18 fill 65 rows of 32 (two a row, the 18 alone), which run as 96 (3,072 slots), or 43 rows of
    48 (three a row), which run as 48 (2,304 slots); one sample a row of 24 takes 3,072. Shared, a group of 8
    samples of an 11-token prompt takes 10 + 8 x 5 slots: 1,024 slots in all (half a group a row of 32, or a
    whole group a row of 64)."""
    max_len = model_cfg.max_position_embeddings
    T = int(allgather(batch_length(s, max_len)).max())
    if not pack:
        return T
    options = [T]
    while len(options) < candidates + 3 * share and options[-1] < max_len:
        options.append(min(bucket_length(options[-1] + 1), max_len))
    if len(options) == 1:
        return T
    rows = allgather(np.array([packed_rows(unit_lengths(s, row_units(s, t, share), t), t) for t in options],
                              np.int64)).max(0)
    computed = [sum(micro_batch_sizes(t, int(r), tokens_per_micro_batch, mesh)) * t for r, t in zip(rows, options)]
    cost = [c * model_cfg.flops_per_token(t) for c, t in zip(computed, options)]
    return options[int(np.argmin(cost))]


def micro_batch_sizes(T: int, rows: int, tokens_per_micro_batch: int, mesh) -> list[int]:
    """Rows each micro-batch of a mini-batch takes from this process, for `rows` rows (the most any process
    has): full micro-batches of tokens_per_micro_batch / T rows over all processes (one shape per row length
    T), and a last one cut to the rows left, rounded up to 1, 2, 3, 4, 6, 8, 12, ... (at most a third of it
    padding, a few more shapes, each compiled once; none where a full micro-batch is one row per shard, as at
    long row lengths). Multiples of `unit`, so that a global micro-batch splits evenly over the batch shards
    (data x fsdp) and the processes."""
    count = jax.process_count()
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    unit = math.lcm(shards, count) // count
    full = max(1, tokens_per_micro_batch // T // count // unit) * unit
    n = max(1, -(-rows // full))
    units = -(-max(rows - (n - 1) * full, 1) // unit)
    return [full] * (n - 1) + [min(full, unit * (1 if units <= 1 else bucket_length(units, lo=2)))]


def learner_batches(s: Scored, adv: np.ndarray, T: int, step: int, cfg: RLConfig, mesh, share: bool = False
                    ) -> tuple[list[list[dict]], list[np.ndarray], dict[str, float]]:
    """This process's groups as `mgpo.mini_batches` mini-batches (whole groups each; with several, a
    permutation of the groups keyed by (rollout.sampler.seed, `step`: the optimiser updates before this RL
    step, state.step)), each a list of micro-batches: global arrays of
    rows [b, T] (vt.rl.rollouts.build_rows, packed or padded as train.pack_rows says, prompts shared as `share`
    says; b: micro_batch_sizes)
    with per-token advantages and objective weights (objectives.objective_weights over the whole mini-batch,
    all processes). Every process makes the same micro-batches of the same shapes (empty rows fill them up).
    Returns them, each mini-batch's group indices, and the step's token counts: real (slots holding a token) and
    computed (row slots), all processes, one pass."""
    m, t = cfg.mgpo, cfg.train
    E, C = adv.shape
    if E % m.mini_batches:
        raise VtError(f"config mgpo.mini_batches={m.mini_batches} must divide the prompt groups of a process "
                      f"(rollout.prompts_per_step / processes = {E}): a mini-batch keeps whole groups")
    k = E // m.mini_batches
    order = np.random.default_rng([cfg.rollout.sampler.seed, step]).permutation(E) if m.mini_batches > 1 else np.arange(E)
    groups = [order[i * k:(i + 1) * k] for i in range(m.mini_batches)]
    minis = []
    for g in groups:
        rows = build_rows(s.select(g), T, pack=t.pack_rows, share=share)
        rows["adv"] = per_token(adv[g].reshape(-1), rows["sample"])
        used = rows["sample"] >= 0
        completion = np.bincount(rows["sample"][used], weights=rows["loss_mask"][used], minlength=k * C)
        minis.append((rows, completion))
    # One collective for the whole step: each mini-batch's completion tokens, rows and real slots, per process.
    counts = allgather(np.array([[c.sum(), len(r["input_ids"]), np.count_nonzero(r["segment_ids"])]
                                 for r, c in minis], np.int64))
    completion_tokens, real = counts[..., 0].sum(0), counts[..., 2].sum()
    sh = row_sharding(mesh)
    out, computed = [], 0
    for i, (rows, completion) in enumerate(minis):
        weights = obj.objective_weights(completion, m.aggregation, k * C * jax.process_count(),
                                        int(completion_tokens[i]))
        rows["weight"] = per_token(weights, rows["sample"]) * rows["loss_mask"]
        micro, start = [], 0
        for b in micro_batch_sizes(T, int(counts[:, i, 1].max()), t.tokens_per_micro_batch, mesh):
            part = {key: rows[key][start:start + b] for key in ROW_KEYS}
            part = {key: np.concatenate([v, np.zeros((b - len(v), T), v.dtype)]) if len(v) < b else v
                    for key, v in part.items()}
            micro.append(global_batch(part, sh))
            start += b
            computed += b * jax.process_count() * T
        out.append(micro)
    return out, groups, {"tokens_real": float(real), "tokens_computed": float(computed),
                         "padding_fraction": 1.0 - float(real) / max(computed, 1)}


def rollout_metrics(s: Scored, domains: list[str]) -> dict[str, float]:
    """Step statistics over every process's groups (gathered; process order is prompt order)."""
    def digest(group) -> np.ndarray:
        h = hashlib.sha256()
        for smp in group:
            h.update(np.asarray(smp.completion_ids, np.int32).tobytes() + b"|")
        return np.frombuffer(h.digest(), np.uint8)

    local = {"correct": s.correct, "rewards": s.rewards, "valid": s.valid, "lengths": s.lengths,
             "truncated": s.truncated, "domain": np.array([domains.index(d) for d in s.domains], np.int32),
             "timeouts": s.timeouts if s.timeouts is not None else np.zeros_like(s.valid),
             "digest": np.stack([digest(g) for g in s.samples])}
    g = {k: (lambda a: a.reshape(-1, *a.shape[2:]))(allgather(v)) for k, v in local.items()}
    p = np.asarray(obj.group_accuracy(g["correct"], g["valid"]))
    valid, rewards = g["valid"], g["rewards"]
    hist = np.histogram(p, bins=5, range=(0.0, 1.0))[0] / max(len(p), 1)
    out = {f"pass_rate_hist/{i / 5:.1f}-{(i + 1) / 5:.1f}": float(v) for i, v in enumerate(hist)}
    out |= {"rollout_hash": hashlib.sha256(g["digest"].tobytes()).hexdigest()[:16],
            "reward_mean": float(rewards[valid].mean()) if valid.any() else float("nan"),
            "accuracy": float(p.mean()), "groups_all_correct": float((p == 1).mean()),
            "groups_all_wrong": float((p == 0).mean()), "verifier_errors": float((~valid).mean()),
            # wrong answers whose check or program ran out of time (a verdict of 0, not a verifier error)
            "wrong_timeouts": float(g["timeouts"].mean()),
            "response_len_mean": float(g["lengths"].mean()), "response_len_max": float(g["lengths"].max()),
            "truncated_fraction": float(g["truncated"].mean())}
    for i in sorted(set(g["domain"].tolist())):
        v = valid[g["domain"] == i]
        out[f"reward_mean/{domains[i]}"] = float(rewards[g["domain"] == i][v].mean()) if v.any() else float("nan")
    return out


def refuse_asynchronous_checkpoint(ckpt) -> None:
    """A synchronous run (max_staleness = 0) restores no rollout buffer, so resuming an asynchronous run's checkpoint
    with it would drop the sampled-ahead groups and change the run's schedule silently (k >= 1 against another k
    is refused by RolloutBuffer.set_state): VtError when the newest checkpoint holds a rollout buffer."""
    latest = ckpt.latest_step()
    data = ckpt.step_dir(latest) / "data" if latest is not None else None
    if data is None or not data.is_dir():
        return
    written = "k >= 1"
    for f in sorted(data.iterdir()):
        try:
            written = int(json.loads(f.read_text())["max_staleness"])
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    raise VtError(f"config rollout.max_staleness=0: the checkpoint's rollout buffer (step {latest}) was written with "
                  f"max_staleness={written}; resume with that value or a new --workdir")


def train_rl(cfg: RLConfig, workdir: Path | str) -> TrainResult:
    """Run (or resume) MGPO in `workdir` until `train.steps`, a SIGTERM, or a non-finite step."""
    with run_workdir(cfg, workdir) as workdir:
        return Learner(cfg, workdir).run()
