"""The recipe's stages and what they share: `STAGES`, the one ordered table of `Stage` records, each with its
`plan` (resolve the typed config, list the user-supplied inputs; runs nothing, so `--validate` calls it for every
stage) and its `run` (do the work in the stage directory). Every other list of stage names derives from STAGES.

Wiring between stages lives here and only here: which checkpoint a stage starts from, the tokenizer every
stage shares, the profiling file SFT stage 2 and the RL stages read, the RL checkpoints self-distillation
samples from. A stage section of the config holds its learner's own config (SftConfig, RLConfig,
SelfDistillConfig, EvalConfig fields) plus a few pipeline fields (`enabled`, `profile_k`, ...); its plan types it
once, as the recipe is loaded (Plan[C]: RLStageConfig, SelfDistillStageConfig, ...).

A new stage is one `plan_*` / `run_*` pair and one record in STAGES (and a section in the recipe configs).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Annotated, Any, Callable, Generic, TypeVar

import numpy as np
from flax import nnx

from vt import VtError
from vt.checkpoint.params import export_to_hf, load_model
from vt.checkpoint.seal import sealed_steps
from vt.config import to_dataclass
from vt.data.curriculum import load_pass_rates
from vt.data.tasks import task_corpus, task_records
from vt.data.qwen_tokenizer import QWEN25_CHAT_TEMPLATE
from vt.data.tokenizer import QWEN_CHAT_TEMPLATE, TINY_CORPUS, build_tiny_tokenizer, load_tokenizer
from vt.distributed import process_mesh
from vt.distill.run import DOMAINS as DISTILL_DOMAINS
from vt.distill.run import SelfDistillConfig, run_self_distill as distill_traces
from vt.eval.runner import EvalConfig, run_eval
from vt.io import write_jsonl
from vt.rewards.registry import make_reward
from vt.rl.learner import RLConfig, train_rl
from vt.rl.profile import profile
from vt.rl.rollouts import load_records, rollout_and_score
from vt.sampling.config import Request, SamplerConfig
from vt.sampling.engine import Engine
from vt.sharding import MeshConfig
from vt.tracking import LoggingConfig
from vt.train.selection import mean_pass_at_k, select_and_merge
from vt.train.sft import SftConfig, train
from vt.validation import AT_LEAST_1, FRACTION, NON_NEGATIVE, check_fields

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


# --- the recipe's own config --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """The held-out accuracy table: avg@n (n = sampler.n) of each domain's prompts after every stage that trains."""
    data: dict = dataclasses.field(default_factory=dict)  # domain -> prompt file ({} = no table)
    limit: Annotated[int, NON_NEGATIVE] = 64  # prompts per domain (0 = all)
    sampler: SamplerConfig = SamplerConfig(n=4, max_new_tokens=64, batch_size=256)
    # the sampler's mesh over this process's devices (vt.distributed.process_mesh, as vt eval's model.mesh): one
    # device by default; fsdp=-1 shards the weights and the KV pool over all of them (`vt plan` on 16 GB chips)
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    name: str = "recipe"
    base_checkpoint: str = ""  # vt checkpoint sft1 starts from ("" = random init of sft1.model.preset: demo)
    tokenizer: str = ""  # HF tokenizer directory or SentencePiece .model, shared by every stage
    compilation_cache: str = ""  # JAX persistent compilation cache directory ("" = off)
    probe: ProbeConfig = ProbeConfig()
    stages: dict = dataclasses.field(default_factory=dict)  # stage name -> its section (plan_* types it)
    logging: LoggingConfig = LoggingConfig()  # W&B for every stage (stage_logging)


@dataclasses.dataclass
class StageOutput:
    checkpoint: str | None = None
    metrics: dict = dataclasses.field(default_factory=dict)
    inputs: dict = dataclasses.field(default_factory=dict)
    learner_dir: Path | None = None  # where the stage's learner ran (its W&B run), if one did


C = TypeVar("C")


@dataclasses.dataclass
class Plan(Generic[C]):
    config: C  # the typed config the stage runs with (its Stage record's `section`, resolved and wired)
    inputs: list  # [(field, path, kind)] supplied by the user: checked by validation


class Context:
    """What a stage sees: the config, the work directory, finished stages' manifests."""

    def __init__(self, cfg: RecipeConfig, workdir: Path, dry: bool = False):
        self.cfg, self.workdir, self.dry = cfg, workdir, dry

    def section(self, stage: str) -> dict:
        """`stage`'s section of the config, less `enabled` (which the recipe reads, not the stage)."""
        return {k: v for k, v in self.cfg.stages.get(stage, {}).items() if k != "enabled"}

    def plan(self, stage: str) -> Plan:
        """`stage`'s typed config (and inputs), as it runs."""
        return STAGE_BY_NAME[stage].plan(self, self.section(stage), self.stage_dir(stage))

    def enabled(self, stage: str) -> bool:
        return stage in self.cfg.stages and bool(self.cfg.stages[stage].get("enabled", True))

    def stage_dir(self, stage: str) -> Path:
        return self.workdir / stage

    def manifest(self, stage: str) -> dict | None:
        path = self.stage_dir(stage) / MANIFEST
        return json.loads(path.read_text()) if path.is_file() else None

    def output_of(self, stage: str) -> dict:
        """A finished upstream stage's manifest (in a dry run: a placeholder naming the future checkpoint)."""
        m = self.manifest(stage)
        if m is not None:
            if m.get("checkpoint") and not Path(m["checkpoint"]).is_absolute():
                m["checkpoint"] = str(self.workdir / m["checkpoint"])  # manifests name their own files relatively
            return m
        if self.dry:
            return {"stage": stage, "checkpoint": str(self.stage_dir(stage) / "<checkpoint>"), "metrics": {}}
        raise VtError(f"stage {stage!r} has not finished in {self.workdir} (run it first, or without --only)")

    def checkpoint_before(self, stage: str) -> str:
        """The checkpoint `stage` starts from: the last enabled model stage before it, else the base."""
        earlier = STAGE_NAMES[:STAGE_NAMES.index(stage)]
        for prev in reversed(earlier):
            if STAGE_BY_NAME[prev].trains_model and self.enabled(prev):
                return self.output_of(prev)["checkpoint"]
        if not self.cfg.base_checkpoint and stage != "sft1":
            raise VtError(f"stage {stage!r}: no earlier stage trains a model and base_checkpoint is empty")
        return self.cfg.base_checkpoint


def stage_logging(ctx: Context, stage: str, own: LoggingConfig = LoggingConfig()) -> LoggingConfig:
    """A stage's W&B settings: its own section's when that names a project, else the recipe's as one run per
    stage, named <run name or recipe name>/<stage>, tagged with the stage, grouped by pipeline work directory."""
    r = ctx.cfg.logging
    if own.wandb_project or not r.wandb_project:
        return own
    return dataclasses.replace(r, wandb_run_name=f"{r.wandb_run_name or ctx.cfg.name}/{stage}",
                               wandb_group=r.wandb_group or f"{ctx.cfg.name}-{ctx.workdir.name}",
                               wandb_tags=(*r.wandb_tags, stage))


def _replace(obj, **changes):
    """dataclasses.replace along dotted paths: _replace(cfg, **{"data.tokenizer": "x"})."""
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        obj = dataclasses.replace(obj, **{head: _replace(getattr(obj, head), **{rest: value}) if rest else value})
    return obj


def final_checkpoint(run_dir: Path) -> str:
    """The last sealed checkpoint a learner left in `run_dir`/checkpoints."""
    steps = sealed_steps(run_dir / "checkpoints")
    if not steps:
        raise VtError(f"{run_dir / 'checkpoints'}: the learner finished without a checkpoint")
    return str(run_dir / "checkpoints" / str(steps[-1]))




def _dump_records(records, path: Path) -> Path:
    return write_jsonl(path, ({"id": r.prompt_id, "domain": r.domain, "messages": list(r.prompt),
                               "ground_truth": r.ground_truth, "metadata": r.metadata} for r in records))


def _load_limited(path: str, limit: int, where: str):
    records = load_records(path, where)
    return records[:limit] if limit else records


# --- data (demo only) -------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DataStageConfig:
    out: str = ""  # directory the files go to (the demo: {workdir}/data)
    seed: Annotated[int, NON_NEGATIVE] = 0
    domains: tuple[str, ...] = ("math", "code", "stem", "instruct")
    noise: Annotated[float, FRACTION] = 0.5  # fraction of SFT answers that are wrong: the imperfect teacher RL improves on
    sft_per_domain: Annotated[int, AT_LEAST_1] = 1000  # SFT records per domain (several traces per math prompt: multi-path)
    rl_per_domain: Annotated[int, AT_LEAST_1] = 256  # RL prompts per domain
    heldout_per_domain: Annotated[int, AT_LEAST_1] = 64  # held-out prompts per domain (the accuracy table, eval)
    probe_per_domain: Annotated[int, AT_LEAST_1] = 32  # probing prompts per domain (Pass@K checkpoint selection), disjoint from held-out
    vocab_size: Annotated[int, AT_LEAST_1] = 512  # the tokenizer's vocabulary: exactly the model's (see run_data)

    def __post_init__(self):
        check_fields(self)


def plan_data(ctx: Context, section: dict, sdir: Path) -> Plan:
    cfg = to_dataclass(DataStageConfig, section, "config.stages.data")
    if not cfg.out:
        raise VtError("out: the directory for the synthetic data is not set")
    return Plan(cfg, [])


def run_data(ctx: Context, plan: Plan[DataStageConfig], sdir: Path) -> StageOutput:
    c = plan.config
    out = Path(c.out)
    sft = []
    for d in c.domains:
        sft += task_records(d, c.sft_per_domain, c.seed, noise=c.noise)
    order = np.random.default_rng(c.seed).permutation(len(sft))
    write_jsonl(out / "sft.jsonl", [sft[i] for i in order])
    heldout_sft = []
    for d in c.domains:
        heldout_sft += task_records(d, 16, c.seed, split="eval", noise=c.noise, start=50_000)
        write_jsonl(out / f"rl_{d}.jsonl", task_records(d, c.rl_per_domain, c.seed, with_answer=False,
                                                         start=100_000))
        write_jsonl(out / f"heldout_{d}.jsonl", task_records(d, c.heldout_per_domain, c.seed, split="eval",
                                                              with_answer=False))
        write_jsonl(out / f"probe_{d}.jsonl", task_records(d, c.probe_per_domain, c.seed, split="eval",
                                                            with_answer=False, start=10_000))
    write_jsonl(out / "sft_heldout.jsonl", heldout_sft)
    # A byte-level BPE in Qwen2's own pipeline (NFC, Qwen2's split regex, byte-level), so the export loads in
    # transformers as Qwen2's tokenizer with the same ids (transformers >= 5 builds every qwen2 model's tokenizer
    # that way, whatever tokenizer.json says). The built-in corpus gives the merges the tasks alone run out of.
    # The tools task (the demo's tools variant) needs a template that renders tool turns as the sampler writes
    # them (Qwen2.5's) and a corpus of its own domains; the other tasks keep vt's ChatML and the four tasks' corpus.
    tools = "tools" in c.domains
    corpus = task_corpus(c.seed, domains=tuple(c.domains)) if tools else task_corpus(c.seed)
    tok = build_tiny_tokenizer(out / "tokenizer", corpus + list(TINY_CORPUS), vocab_size=c.vocab_size,
                               chat_template=QWEN25_CHAT_TEMPLATE if tools else QWEN_CHAT_TEMPLATE)
    # Every id the model can sample must decode: the vocabularies match exactly.
    if tok.vocab_size != c.vocab_size:
        raise VtError(f"the tokenizer has {tok.vocab_size} tokens, not vocab_size={c.vocab_size} "
                      f"(the corpus is too small for that many); the model could sample undecodable ids")
    return StageOutput(metrics={"sft_records": len(sft), "vocab_size": tok.vocab_size},
                       inputs={"generated_into": str(out)})


# --- SFT stages -------------------------------------------------------------------------------------------------

def _sft_config(ctx: Context, section: dict, stage: str, init: str, **wiring):
    cfg = to_dataclass(SftConfig, section, f"config.stages.{stage}")
    changes = {"model.init_checkpoint": init, "logging": stage_logging(ctx, stage.partition(".")[0], cfg.logging),
               **wiring}
    if cfg.data.kind == "chat":
        changes["data.tokenizer"] = ctx.cfg.tokenizer
    return _replace(cfg, **changes)


def _sft_inputs(cfg, stage: str) -> list:
    inputs = []
    if cfg.data.kind == "chat":
        inputs.append((f"config.stages.{stage}.data.train", cfg.data.train, "data"))
        if cfg.data.eval:
            inputs.append((f"config.stages.{stage}.data.eval", cfg.data.eval, "data"))
    return inputs


def plan_sft1(ctx, section, sdir) -> Plan:
    cfg = _sft_config(ctx, section, "sft1", ctx.cfg.base_checkpoint)
    return Plan(cfg, _sft_inputs(cfg, "sft1"))


def plan_sft2(ctx, section, sdir) -> Plan:
    wiring = {}
    if ctx.enabled("profile"):
        wiring["data.hard_subset.pass_rates"] = str(ctx.stage_dir("profile") / "pass_rates.jsonl")
    cfg = _sft_config(ctx, section, "sft2", ctx.checkpoint_before("sft2"), **wiring)
    return Plan(cfg, _sft_inputs(cfg, "sft2"))


def run_sft(ctx, plan: Plan[SftConfig], sdir: Path) -> StageOutput:
    result = train(plan.config, sdir)
    if result.status != "finished":
        raise VtError(f"SFT in {sdir} stopped ({result.status}) at step {result.step}; re-run to resume")
    metrics = {k: result.last_metrics.get(k) for k in ("loss", "eval_loss", "grad_norm") if k in result.last_metrics}
    metrics["steps"] = result.step
    metrics["checkpoints"] = [str(sdir / "checkpoints" / str(s)) for s in sealed_steps(sdir / "checkpoints")]
    return StageOutput(checkpoint=final_checkpoint(sdir), metrics=metrics,
                       inputs={"init_checkpoint": plan.config.model.init_checkpoint, "train": plan.config.data.train,
                               "pass_rates": plan.config.data.hard_subset.pass_rates}, learner_dir=sdir)


# --- profiling ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ProfileStageConfig:
    data: str = ""  # prompts to profile ("" = sft1's training data, one prompt per prompt id)
    prompts_per_call: Annotated[int, AT_LEAST_1] = 64
    limit: Annotated[int, NON_NEGATIVE] = 0  # profile only the first N distinct prompts (0 = all)
    sampler: SamplerConfig = SamplerConfig(n=8, max_new_tokens=4096, batch_size=64)  # RECIPE: n = 8 rollouts
    # the sampler's mesh over this process's devices (vt.distributed.process_mesh, as vt eval's model.mesh): one
    # device by default; fsdp=-1 shards the weights and the KV pool over all of them (`vt plan` on 16 GB chips)
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)

    def __post_init__(self):
        check_fields(self)


def plan_profile(ctx, section, sdir) -> Plan:
    cfg = to_dataclass(ProfileStageConfig, section, "config.stages.profile")
    inputs = [("config.stages.profile.data", cfg.data, "data")] if cfg.data else []
    if not cfg.data and not ctx.enabled("sft1"):
        raise VtError("data: empty, and sft1 (whose training data it defaults to) is disabled")
    return Plan(cfg, inputs)


def run_profile(ctx, plan: Plan[ProfileStageConfig], sdir: Path) -> StageOutput:
    c = plan.config
    data = c.data or ctx.plan("sft1").config.data.train
    seen, records = set(), []
    for r in load_records(data, "profile.data"):
        if r.prompt_id not in seen and (not c.limit or len(records) < c.limit):
            seen.add(r.prompt_id)
            records.append(r)
    prompts = _dump_records(records, sdir / "prompts.jsonl")
    ckpt = ctx.checkpoint_before("profile")
    out = sdir / "pass_rates.jsonl"
    s = c.sampler
    profile(Path(ckpt), Path(ctx.cfg.tokenizer), str(prompts), out, s, k=s.n, prompts_per_call=c.prompts_per_call,
            mesh=c.mesh if process_mesh(c.mesh).size > 1 else None, progress=False)  # one device: no mesh
    rates = load_pass_rates(out)
    vals = [r.pass_rate for r in rates.values()]
    return StageOutput(metrics={"prompts": len(vals), "mean_pass_rate": sum(vals) / max(1, len(vals)),
                                "never_solved": sum(v == 0 for v in vals), "always_solved": sum(v == 1 for v in vals)},
                       inputs={"checkpoint": ckpt, "data": data, "pass_rates": str(out)})


# --- Pass@K selection and merge -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SelectStageConfig:
    pools: tuple[str, ...] = ("sft2",)  # SFT stages whose periodic checkpoints are the candidates
    probes: dict = dataclasses.field(default_factory=dict)  # domain -> probing prompts (verifiable)
    k: Annotated[int, AT_LEAST_1] = 4  # Pass@K from sampler.n samples per probe (RECIPE: selection by pass@k, not pass@1 or loss)
    limit: Annotated[int, NON_NEGATIVE] = 0  # probes per domain (0 = all)
    sampler: SamplerConfig = SamplerConfig(n=8, max_new_tokens=4096, batch_size=64)
    # the sampler's mesh over this process's devices (vt.distributed.process_mesh, as vt eval's model.mesh): one
    # device by default; fsdp=-1 shards the weights and the KV pool over all of them (`vt plan` on 16 GB chips)
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)

    def __post_init__(self):
        check_fields(self)


def plan_select(ctx, section, sdir) -> Plan:
    cfg = to_dataclass(SelectStageConfig, section, "config.stages.select")
    bad = [p for p in cfg.pools if p not in ("sft1", "sft2") or not ctx.enabled(p)]
    if bad or not cfg.pools:
        raise VtError(f"pools: {list(cfg.pools)}: need enabled SFT stages among sft1, sft2")
    if not cfg.probes:
        raise VtError("probes: no probing set (domain -> prompt file)")
    if not 1 <= cfg.k <= cfg.sampler.n:
        raise VtError(f"k={cfg.k} must be in [1, sampler.n={cfg.sampler.n}]")
    return Plan(cfg, [(f"config.stages.select.probes.{d}", p, "data") for d, p in cfg.probes.items()])


class _Verifier:
    """Engine + rewards for a set of domains, reused across checkpoints (weights swapped in place)."""

    def __init__(self, ctx: Context, domains, sampler: SamplerConfig, mesh: MeshConfig):
        self.tokenizer = load_tokenizer(ctx.cfg.tokenizer)
        self.rewards = {d: make_reward(d) for d in domains}
        self.sampler, self.engine = sampler, None
        self.mesh = process_mesh(mesh)
        self.mesh = None if self.mesh.size == 1 else self.mesh  # one device: nothing to shard (as vt eval)

    def load(self, ckpt: str) -> None:
        model = load_model(ckpt, self.mesh)  # restored straight into the mesh's sharding
        if self.engine is None:
            self.engine = Engine(model, self.sampler, mesh=self.mesh, tokenizer=self.tokenizer)
        else:
            self.engine.update_weights(nnx.state(model))

    def score(self, records, domain: str, seed: int, n: int = 0):
        """n (0: sampler.n) verified samples of each record."""
        return rollout_and_score(self.engine, self.tokenizer, records, {domain: self.rewards[domain]},
                                 group_size=n or self.sampler.n, seed=seed, max_prompt_tokens=1 << 30, domain=domain)

    def close(self):
        for r in self.rewards.values():
            r.close()
        if self.engine is not None:  # its tool threads
            self.engine.close()


def run_select(ctx, plan: Plan[SelectStageConfig], sdir: Path) -> StageOutput:
    c = plan.config
    candidates = [ctx.stage_dir(pool) / "checkpoints" / str(step) for pool in c.pools
                  for step in sealed_steps(ctx.stage_dir(pool) / "checkpoints")]
    if not candidates:
        raise VtError(f"select: no checkpoints in {list(c.pools)}")
    probes = {d: _load_limited(p, c.limit, f"select.probes.{d}") for d, p in sorted(c.probes.items())}
    v = _Verifier(ctx, probes, c.sampler, c.mesh)

    def scorer(ckpt: Path) -> dict[str, float]:
        v.load(str(ckpt))
        out = {}
        for i, (d, recs) in enumerate(probes.items()):
            s = v.score(recs, d, seed=c.sampler.seed * 1000 + i)
            out[d] = mean_pass_at_k(s.valid, s.correct, c.k)
        log.info("select: %s %s", ckpt, out)
        return out

    try:
        report = select_and_merge(candidates, scorer, sdir / "merged")
    finally:
        v.close()
    return StageOutput(checkpoint=str(sdir / "merged"), metrics=report,
                       inputs={"candidates": [str(p) for p in candidates], "probes": dict(c.probes)})


# --- RL stages ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RLStageConfig:
    """An RL stage: its learner's config (the RLConfig fields, at the top level of the stage's section) and the
    pipeline's own fields."""
    rl: RLConfig
    # RECIPE: profile the phase's starting checkpoint with k rollouts per prompt and drop the prompts it solves
    # always or never (0 = no profiling).
    profile_k: Annotated[int, NON_NEGATIVE] = 8
    profile_max_new_tokens: Annotated[int, NON_NEGATIVE] = 0  # 0 = rl.rollout.sampler.max_new_tokens
    # The stage whose checkpoint it starts from ("" = the last enabled stage before it that trains a model):
    # the opd stage's student may be an early one (the demo's: sft1)
    start_from: str = ""

    def __post_init__(self):
        check_fields(self)


def plan_rl(stage: str):
    def plan(ctx, section, sdir) -> Plan[RLStageConfig]:
        pipeline = [f.name for f in dataclasses.fields(RLStageConfig) if f.name != "rl"]
        own = {k: section.pop(k) for k in pipeline if k in section}
        where = f"config.stages.{stage}"
        cfg = to_dataclass(RLStageConfig, {**own, "rl": to_dataclass(RLConfig, section, where)}, where)
        if cfg.start_from and cfg.start_from not in STAGE_NAMES[:STAGE_NAMES.index(stage)]:
            raise VtError(f"{where}.start_from={cfg.start_from!r}: not a stage before {stage!r}")
        init = ctx.output_of(cfg.start_from)["checkpoint"] if cfg.start_from else ctx.checkpoint_before(stage)
        wiring = {"model.init_checkpoint": init, "data.tokenizer": ctx.cfg.tokenizer,
                  "logging": stage_logging(ctx, stage, cfg.rl.logging)}
        if cfg.rl.opd.teacher in STAGE_NAMES:  # OPD's teacher named as an earlier stage: its checkpoint
            wiring["opd.teacher"] = ctx.output_of(cfg.rl.opd.teacher)["checkpoint"]
        if cfg.profile_k > 0:
            wiring["data.profile"] = str(sdir / "profile.jsonl")
        rl = _replace(cfg.rl, **wiring)
        if stage == "long2short" and rl.mgpo.long2short_lambda <= 0:
            raise VtError("mgpo.long2short_lambda must be > 0 in the Long2Short stage (RECIPE: 0.2)")
        if stage == "opd" and not rl.opd.enabled:
            raise VtError(f"{where}.opd.teacher must name the teacher: a checkpoint, an http(s):// endpoint or an "
                          "earlier stage")
        inputs = [(f"{where}.data.train", rl.data.train, "data")]
        if rl.data.eval:
            inputs.append((f"{where}.data.eval", rl.data.eval, "data"))
        return Plan(dataclasses.replace(cfg, rl=rl), inputs)
    return plan


def run_rl(ctx, plan: Plan[RLStageConfig], sdir: Path) -> StageOutput:
    cfg, c = plan.config.rl, plan.config
    metrics: dict[str, Any] = {}
    if c.profile_k > 0:  # RECIPE: drop prompts the phase's start always or never solves
        r = cfg.rollout.sampler
        sampler = dataclasses.replace(r, max_new_tokens=c.profile_max_new_tokens or r.max_new_tokens)
        profile(Path(cfg.model.init_checkpoint), Path(cfg.data.tokenizer), cfg.data.train, Path(cfg.data.profile),
                sampler, k=c.profile_k, domain=cfg.data.domain, max_prompt_tokens=cfg.data.max_prompt_tokens,
                mesh=cfg.mesh, progress=False)
        rates = load_pass_rates(cfg.data.profile)
        if rates and all(r.pass_rate in (0.0, 1.0) for r in rates.values()):
            # Every group would have zero advantage: there is nothing to learn, so the checkpoint passes on.
            log.warning("%s: every prompt has pass rate 0 or 1 under %s; RL skipped", sdir.name,
                        cfg.model.init_checkpoint)
            return StageOutput(checkpoint=cfg.model.init_checkpoint, metrics={"skipped": "all prompts trivial"},
                               inputs={"init_checkpoint": cfg.model.init_checkpoint, "train": cfg.data.train})
    result = train_rl(cfg, sdir)
    if result.status != "finished":
        raise VtError(f"RL in {sdir} stopped ({result.status}) at step {result.step}; re-run to resume")
    steps = [r for r in result.history if "reward_mean" in r]
    if steps:
        k = max(1, len(steps) // 5)
        mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)  # noqa: E731
        metrics.update(reward_first=mean(steps[:k], "reward_mean"), reward_last=mean(steps[-k:], "reward_mean"),
                       response_len_first=mean(steps[:k], "response_len_mean"),
                       response_len_last=mean(steps[-k:], "response_len_mean"),
                       prompts_dropped=steps[-1].get("prompts_dropped", 0))
        if "opd/reverse_kl" in steps[0]:  # on-policy distillation: the per-token KL to the teacher, first vs last
            metrics.update(reverse_kl_first=mean(steps[:k], "opd/reverse_kl"),
                           reverse_kl_last=mean(steps[-k:], "opd/reverse_kl"),
                           teacher_tokens=sum(r["opd/teacher_tokens"] for r in steps))
            # the learning curve: held-out accuracy against the teacher-scored tokens before it (step s: s steps')
            seen = np.concatenate([[0.0], np.cumsum([r["opd/teacher_tokens"] for r in steps])])
            metrics["heldout_vs_teacher_tokens"] = [[float(seen[min(s, len(steps))]), acc]
                                                    for s, acc in result.eval_history]
    metrics["steps"] = result.step
    metrics["eval_history"] = result.eval_history
    return StageOutput(checkpoint=final_checkpoint(sdir), metrics=metrics,
                       inputs={"init_checkpoint": cfg.model.init_checkpoint, "train": cfg.data.train,
                               "profile": cfg.data.profile}, learner_dir=sdir)


# --- on-policy distillation's baseline: SFT on the teacher's samples ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OpdSftStageConfig:
    """The opd stage's comparison arm (`vt demo --variant opd`): its student SFT'd on its teacher's own samples of
    its training prompts, as many teacher-generated tokens as the opd stage's teacher scored (so the two spend the
    same teacher tokens), held-out accuracy measured as the opd stage measures it (its held-out prompts, samples
    per prompt, sampler and verifier) against the teacher tokens trained on so far; the teacher measured alike."""
    sft: SftConfig  # the SFT learner; the pipeline sets its start (opd's student), data (the samples), one epoch
    samples_per_prompt: Annotated[int, AT_LEAST_1] = 4  # teacher samples per training prompt and pass over them
    eval_every: Annotated[int, AT_LEAST_1] = 2  # SFT steps between held-out measurements (the checkpoint cadence)
    seed: Annotated[int, NON_NEGATIVE] = 0  # the teacher's samples (prompt order and sampling)

    def __post_init__(self):
        check_fields(self)


def plan_opd_sft(ctx, section, sdir) -> Plan[OpdSftStageConfig]:
    where = "config.stages.opd_sft"
    if not ctx.enabled("opd"):
        raise VtError(f"{where}: the opd stage (its teacher, student, prompts and held-out set) is disabled")
    opd = ctx.plan("opd").config.rl
    if opd.opd.teacher.startswith(("http://", "https://")):
        raise VtError(f"{where}: samples the opd stage's teacher, which must then be a checkpoint, not an endpoint "
                      f"({opd.opd.teacher})")
    sft = _sft_config(ctx, section.pop("sft", {}), "opd_sft.sft", opd.model.init_checkpoint)
    cfg = to_dataclass(OpdSftStageConfig, {**section, "sft": sft}, where)
    # one epoch over the samples, a checkpoint (a point of the curve) every eval_every steps, all of them kept
    return Plan(_replace(cfg, **{"sft.data.train": str(sdir / "teacher_samples.jsonl"), "sft.data.eval": "",
                                 "sft.train.steps": 0, "sft.data.num_epochs": 1.0,
                                 "sft.checkpoint.every": cfg.eval_every, "sft.checkpoint.keep": 1 << 20}), [])


def run_opd_sft(ctx, plan: Plan[OpdSftStageConfig], sdir: Path) -> StageOutput:
    c, opd = plan.config, ctx.plan("opd").config.rl
    budget = ctx.output_of("opd")["metrics"]["teacher_tokens"]  # what the opd stage's teacher scored
    records = load_records(opd.data.train, "config.stages.opd.data.train")
    heldout = load_records(opd.data.eval, "config.stages.opd.data.eval")[:opd.train.eval_prompts]
    domain = opd.data.domain or records[0].domain
    v = _Verifier(ctx, [domain], opd.rollout.sampler, MeshConfig(data=1, fsdp=1, tensor=1))

    def accuracy(ckpt: str) -> float:  # the RL learner's held-out accuracy (Learner.evaluate), same seed each
        v.load(ckpt)
        s = v.score(heldout, domain, seed=c.seed * 1000 + 999, n=opd.train.eval_samples)
        return float(s.correct[s.valid].sum() / max(1, s.valid.sum()))

    try:
        teacher_acc = accuracy(opd.opd.teacher)
        rng, rows, made = np.random.default_rng(c.seed), [], 0
        for p in range(1 << 20):  # passes over the prompts in fresh orders until the teacher has written `budget`
            recs = [records[i] for i in rng.permutation(len(records))]
            s = v.score(recs, domain, seed=c.seed * 1000 + p, n=c.samples_per_prompt)
            for r, x in ((r, x) for r, g in zip(recs, s.samples) for x in g if made < budget):
                rows.append({"id": f"{r.prompt_id}-{len(rows)}", "domain": r.domain,
                             "messages": [*r.prompt, {"role": "assistant", "content": x.text}]})
                made += len(x.completion_ids)
            if made >= budget:
                break
        write_jsonl(c.sft.data.train, rows)
        result = train(c.sft, sdir / "sft")
        if result.status != "finished":
            raise VtError(f"SFT in {sdir / 'sft'} stopped ({result.status}); re-run to resume")
        # x: the teacher's tokens the SFT has trained on (its loss tokens) by each checkpoint
        lines = {r["step"]: r for r in map(json.loads, (sdir / "sft" / "metrics.jsonl").read_text().splitlines())
                 if "loss_tokens" in r}
        seen = np.cumsum([0.0] + [lines[k]["loss_tokens"] for k in sorted(lines)])
        curve = [[0.0, accuracy(c.sft.model.init_checkpoint)]]
        curve += [[float(seen[k]), accuracy(str(sdir / "sft" / "checkpoints" / str(k)))]
                  for k in sealed_steps(sdir / "sft" / "checkpoints")]
    finally:
        v.close()
    return StageOutput(metrics={"teacher_heldout": teacher_acc, "teacher_tokens_generated": made,
                                "teacher_samples": len(rows), "sft_steps": result.step,
                                "heldout_vs_teacher_tokens": curve},
                       inputs={"teacher": opd.opd.teacher, "student": c.sft.model.init_checkpoint,
                               "prompts": opd.data.train})


# --- self-distillation --------------------------------------------------------------------------------------------

# The RL stage whose checkpoint teaches each domain, first enabled wins (math: after Long2Short).
TEACHER_STAGES = {"math": ("long2short", "rl_math"), "code": ("rl_code",), "stem": ("rl_stem",)}


def _teacher(ctx: Context, domain: str) -> str:
    for s in TEACHER_STAGES[domain]:
        if ctx.enabled(s):
            return ctx.output_of(s)["checkpoint"]
    return ""


@dataclasses.dataclass(frozen=True)
class SelfDistillStageConfig:
    distill: SelfDistillConfig  # sample the RL teachers, select traces
    sft: SftConfig  # SFT of the student on the selected traces


def plan_self_distill(ctx, section, sdir) -> Plan[SelfDistillStageConfig]:
    where = "config.stages.self_distill"
    dcfg = to_dataclass(SelfDistillConfig, section.pop("distill", {}), f"{where}.distill")
    student = ctx.checkpoint_before("self_distill")
    changes = {"student": student, "tokenizer": ctx.cfg.tokenizer}
    for d in DISTILL_DOMAINS:
        if getattr(dcfg.sources, d).data:
            changes[f"sources.{d}.ckpt"] = _teacher(ctx, d)
    sft = _sft_config(ctx, section.pop("sft", {}), "self_distill.sft", student,
                      **{"data.train": str(sdir / "distill" / "selected.jsonl")})
    cfg = to_dataclass(SelfDistillStageConfig, {**section, "distill": _replace(dcfg, **changes), "sft": sft}, where)
    inputs = [(f"{where}.distill.sources.{d}.data", getattr(cfg.distill.sources, d).data, "data")
              for d in DISTILL_DOMAINS if getattr(cfg.distill.sources, d).ckpt]
    if not inputs:
        raise VtError("distill.sources: no domain has both prompts and an enabled RL stage")
    return Plan(cfg, inputs)


def run_self_distill(ctx, plan: Plan[SelfDistillStageConfig], sdir: Path) -> StageOutput:
    d = plan.config.distill
    report = distill_traces(d, sdir / "distill")
    result = train(plan.config.sft, sdir / "sft")
    if result.status != "finished":
        raise VtError(f"SFT in {sdir / 'sft'} stopped ({result.status}); re-run to resume")
    return StageOutput(checkpoint=final_checkpoint(sdir / "sft"),
                       metrics={"selection": report, "sft_steps": result.step,
                                "sft_loss": result.last_metrics.get("loss")},
                       inputs={"student": d.student,
                               "teachers": {dom: getattr(d.sources, dom).ckpt for dom in DISTILL_DOMAINS}},
                       learner_dir=sdir / "sft")


# --- evaluation and export ----------------------------------------------------------------------------------------

def plan_eval(ctx, section, sdir) -> Plan:
    benchmarks = section.pop("benchmarks", {})
    if section:
        raise VtError(f"unknown field(s) {sorted(section)} (expected enabled, benchmarks)")
    if not benchmarks:
        raise VtError("benchmarks: none configured")
    ckpt = ctx.checkpoint_before("eval")
    cfgs, inputs = {}, []
    for name, b in benchmarks.items():
        e = to_dataclass(EvalConfig, b, f"config.stages.eval.benchmarks.{name}")
        cfgs[name] = _replace(e, **{"model.ckpt": ckpt, "model.tokenizer": ctx.cfg.tokenizer})
        inputs.append((f"config.stages.eval.benchmarks.{name}.data", e.data, "data"))
    return Plan(cfgs, inputs)


def run_eval_stage(ctx, plan: Plan[dict[str, EvalConfig]], sdir: Path) -> StageOutput:
    metrics = {}
    for name, cfg in plan.config.items():
        summary = run_eval(cfg, sdir / name)
        metrics[name] = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ckpt = next(iter(plan.config.values())).model.ckpt
    return StageOutput(metrics=metrics, inputs={"checkpoint": ckpt})


@dataclasses.dataclass(frozen=True)
class ExportStageConfig:
    dtype: str = "bfloat16"  # safetensors dtype
    check_transformers: bool = False  # load the export with transformers and compare greedy text with vt's
    check_prompts: Annotated[int, AT_LEAST_1] = 8  # prompts from the probe data (first of each domain in turn)
    check_max_new_tokens: Annotated[int, AT_LEAST_1] = 32

    def __post_init__(self):
        check_fields(self)


def plan_export(ctx, section, sdir) -> Plan:
    cfg = to_dataclass(ExportStageConfig, section, "config.stages.export")
    if cfg.check_transformers and not ctx.cfg.probe.data:
        raise VtError("check_transformers needs prompts: config.probe.data is empty")
    return Plan(cfg, [])


def run_export(ctx, plan: Plan[ExportStageConfig], sdir: Path) -> StageOutput:
    c = plan.config
    ckpt = ctx.checkpoint_before("export")
    hf = sdir / "hf"
    shutil.rmtree(hf, ignore_errors=True)
    # The pipeline's tokenizer (an HF directory or a SentencePiece .model) goes in as HF tokenizer files,
    # sealed with the weights, its eos / pad ids in config.json and generation_config.json.
    export_to_hf(load_model(ckpt), hf, dtype=c.dtype, tokenizer=ctx.cfg.tokenizer)
    metrics: dict[str, Any] = {"hf_dir": str(hf)}
    if c.check_transformers:
        metrics.update(transformers_check(ctx, ckpt, hf, c, sdir / "greedy.jsonl"))
    return StageOutput(metrics=metrics, inputs={"checkpoint": ckpt}, checkpoint=None)


def transformers_check(ctx: Context, ckpt: str, hf: Path, c: ExportStageConfig, out: Path) -> dict:
    """The export as a user loads it: `AutoTokenizer.from_pretrained(hf)` must give vt's ids (chat prompts and
    their completions), and `AutoModelForCausalLM.from_pretrained(hf).generate(**inputs, do_sample=False)` (no
    stop or pad ids passed: they come from the export's generation_config.json) must give vt's greedy text and
    stop where vt's sampler stops. Without torch only the tokenizer half runs (the result says so)."""
    import transformers  # optional: the demo extra installs it (torch: `make demo HF_CHECK=1`)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in the demo's console
    tok = load_tokenizer(ctx.cfg.tokenizer)
    # transformers >= 5 builds any qwen2 model's tokenizer as Qwen2's byte-level BPE: a SentencePiece one loads as
    # `vt convert` tells users to load it (vt.checkpoint.commands), through tokenizer.json as it is.
    loader = transformers.PreTrainedTokenizerFast if tok.kind == "spm" else transformers.AutoTokenizer
    theirs_tok = loader.from_pretrained(str(hf))
    per_domain = {d: _load_limited(p, c.check_prompts, f"probe.data.{d}")
                  for d, p in sorted(ctx.cfg.probe.data.items())}
    records = [r for group in zip(*per_domain.values()) for r in group][:c.check_prompts]
    prompts = [tok.encode_chat(list(r.prompt), add_generation_prompt=True) for r in records]
    for r, p in zip(records, prompts):
        ids = theirs_tok.apply_chat_template(list(r.prompt), add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
        if list(ids) != p:
            raise VtError(f"{hf}: AutoTokenizer's chat prompt ids differ from vt's on {r.id}: {list(ids)[:12]}... vs "
                          f"{p[:12]}...")
    sc = SamplerConfig(temperature=0.0, max_new_tokens=c.check_max_new_tokens, batch_size=max(8, len(prompts)),
                       stop_token_ids=tuple(tok.eos_token_ids))
    engine = Engine(load_model(ckpt, dtype="float32"), sc, tokenizer=tok)
    ours = [list(s[0].completion_ids) for s in engine.generate([Request(prompt_ids=p) for p in prompts], seed=0)]
    for mine in ours:  # the completions' ids too (the model's own text, not just prompts)
        text = tok.decode(mine)
        if theirs_tok.encode(text, add_special_tokens=False) != tok.encode(text):
            raise VtError(f"{hf}: AutoTokenizer's ids differ from vt's on the text {text[:60]!r}")
    result = {"tokenizer_match": f"{len(prompts)}/{len(prompts)}"}
    try:
        import torch
    except ImportError:
        return {**result, "greedy_match": "skipped (no torch: pip install torch, or make demo HF_CHECK=1)"}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    model.eval()
    rows, matches = [], 0
    for r, mine in zip(records, ours):
        inputs = theirs_tok.apply_chat_template(list(r.prompt), add_generation_prompt=True, tokenize=True,
                                                return_dict=True, return_tensors="pt")
        with torch.no_grad():
            g = model.generate(**inputs, do_sample=False, max_new_tokens=c.check_max_new_tokens)
        theirs = g[0, inputs["input_ids"].shape[1]:].tolist()
        same = mine == theirs
        matches += same
        rows.append({"id": r.id, "domain": r.domain, "prompt": r.prompt[-1]["content"], "same": same,
                     "vt": tok.decode(mine, skip_special_tokens=True),
                     "transformers": theirs_tok.decode(theirs, skip_special_tokens=True),
                     "stopped": bool(theirs) and theirs[-1] in tok.eos_token_ids})
    write_jsonl(out, rows)
    if matches != len(rows):
        bad = next(r for r in rows if not r["same"])
        raise VtError(f"transformers' greedy text differs from vt's on {len(rows) - matches}/{len(rows)} prompts, "
                      f"e.g. {bad['id']}: vt {bad['vt']!r} vs transformers {bad['transformers']!r} (see {out})")
    return {**result, "greedy_match": f"{matches}/{len(rows)}", "stopped_at_end_of_turn":
            f"{sum(r['stopped'] for r in rows)}/{len(rows)}", "greedy_samples": str(out),
            "mean_len": float(np.mean([len(x) for x in ours]))}


# --- held-out accuracy (the per-stage table) ----------------------------------------------------------------------

def heldout_accuracy(ctx: Context, ckpt: str, sdir: Path) -> dict[str, float]:
    """avg@n correctness per probe domain (binary: every test / constraint met), samples saved for inspection."""
    p = ctx.cfg.probe
    data = {d: _load_limited(path, p.limit, f"probe.data.{d}") for d, path in sorted(p.data.items())}
    v = _Verifier(ctx, data, p.sampler, p.mesh)
    acc, rows = {}, []
    try:
        v.load(ckpt)
        for i, (d, recs) in enumerate(data.items()):
            s = v.score(recs, d, seed=p.sampler.seed * 1000 + i)
            acc[d] = float(s.correct[s.valid].mean()) if s.valid.any() else float("nan")
            if p.sampler.tools is not None:  # the share of samples that called a tool and got no error turn
                acc[f"tool_calls_ok/{d}"] = float(np.mean([x.tool_calls > 0 and x.tool_errors == 0
                                                           for g in s.samples for x in g]))
            for q in range(min(4, len(recs))):
                rows.append({"domain": d, "prompt": recs[q].prompt[-1]["content"],
                             "samples": [x.text for x in s.samples[q][:2]], "correct": s.correct[q][:2].tolist()})
    finally:
        v.close()
    write_jsonl(sdir / "heldout_samples.jsonl", rows)
    return acc


# --- the table --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # its config section (config.stages.<name>) and work directory (<workdir>/<name>/)
    plan: Callable[[Context, dict, Path], Plan]  # its Plan's config: what `section` resolves to
    run: Callable[[Context, Plan, Path], StageOutput]
    trains_model: bool  # its output is a model checkpoint: the next training stage starts from it
    # What its config section holds besides `enabled`: a config dataclass (an RL stage's: RLConfig, beside
    # RLStageConfig's own fields), or {key: dataclass} (dict[str, X]: a mapping of X configs). The plan types it;
    # tests check every field is declared.
    section: Any


# In order. Each stage's checkpoint feeds the next stage that trains (a disabled stage passes its input through).
STAGES: tuple[Stage, ...] = (
    Stage("data", plan_data, run_data, False, DataStageConfig),  # demo only: synthetic tasks and their tokenizer
    Stage("sft1", plan_sft1, run_sft, True, SftConfig),
    Stage("profile", plan_profile, run_profile, False, ProfileStageConfig),
    Stage("sft2", plan_sft2, run_sft, True, SftConfig),
    Stage("select", plan_select, run_select, True, SelectStageConfig),
    Stage("rl_math", plan_rl("rl_math"), run_rl, True, RLConfig),  # each RL section also: RLStageConfig's own
    Stage("long2short", plan_rl("long2short"), run_rl, True, RLConfig),
    Stage("rl_code", plan_rl("rl_code"), run_rl, True, RLConfig),
    Stage("rl_stem", plan_rl("rl_stem"), run_rl, True, RLConfig),
    Stage("self_distill", plan_self_distill, run_self_distill, True, SelfDistillStageConfig),
    Stage("rl_instruct", plan_rl("rl_instruct"), run_rl, True, RLConfig),
    # on-policy distillation (vt.rl.opd): off unless configured; its teacher a checkpoint, an endpoint or a stage
    Stage("opd", plan_rl("opd"), run_rl, True, RLConfig),
    # its baseline: the opd student SFT'd on as many of its teacher's sampled tokens (on in vt demo --variant opd)
    Stage("opd_sft", plan_opd_sft, run_opd_sft, False, OpdSftStageConfig),
    Stage("eval", plan_eval, run_eval_stage, False, {"benchmarks": dict[str, EvalConfig]}),
    Stage("export", plan_export, run_export, False, ExportStageConfig),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
STAGE_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
