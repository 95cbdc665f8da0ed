"""The stages of vt.pipeline: for each, `plan` (resolve the typed config, list the user-supplied inputs; runs
nothing, so `--validate` calls it for every stage) and `run` (do the work in the stage directory).

Wiring between stages lives here and only here: which checkpoint a stage starts from, the tokenizer every
stage shares, the profiling file SFT stage 2 and the RL stages read, the RL checkpoints self-distillation
samples from. A stage section of the config holds its learner's own config (SftConfig, RLConfig,
SelfDistillConfig, EvalConfig fields) plus a few pipeline fields (`enabled`, `profile_k`, ...).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from vt import VtError
from vt.config import to_dataclass
from vt.pipeline import Context, StageOutput

log = logging.getLogger(__name__)
RL_STAGES = ("rl_math", "long2short", "rl_code", "rl_stem", "rl_instruct")


@dataclasses.dataclass
class Plan:
    config: Any  # the typed config(s) the stage runs with (a dataclass or a dict of them)
    inputs: list  # [(field, path, kind)] supplied by the user: checked by validation
    extra: dict = dataclasses.field(default_factory=dict)


def _split(section: dict, pipeline_fields: dict) -> tuple[dict, dict]:
    """(pipeline fields with defaults, the rest: the learner's config)."""
    own = {k: section.pop(k, v) for k, v in pipeline_fields.items()}
    section.pop("enabled", None)
    return own, section


def _replace(obj, **changes):
    """dataclasses.replace along dotted paths: _replace(cfg, **{"data.tokenizer": "x"})."""
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        obj = dataclasses.replace(obj, **{head: _replace(getattr(obj, head), **{rest: value}) if rest else value})
    return obj


def _final_step_dir(workdir: Path) -> str:
    from vt.checkpoint.manager import CHECKSUM_FILE
    ckpts = workdir / "checkpoints"
    steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit() and (p / CHECKSUM_FILE).is_file()) \
        if ckpts.is_dir() else []
    if not steps:
        raise VtError(f"{ckpts}: the learner finished without a checkpoint")
    return str(ckpts / str(steps[-1]))


def sealed_steps(workdir: Path) -> list[Path]:
    from vt.checkpoint.manager import CHECKSUM_FILE
    ckpts = workdir / "checkpoints"
    if not ckpts.is_dir():
        return []
    return [ckpts / str(s) for s in sorted(int(p.name) for p in ckpts.iterdir()
                                           if p.name.isdigit() and (p / CHECKSUM_FILE).is_file())]


def _dump_records(records, path: Path) -> Path:
    from vt.data.tasks import write_jsonl
    return write_jsonl(path, ({"id": r.prompt_id, "domain": r.domain, "messages": list(r.prompt),
                               "ground_truth": r.ground_truth, "metadata": r.metadata} for r in records))


# --- data (demo only) -------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DataStage:
    out: str = ""  # directory the files go to (the demo: {workdir}/data)
    seed: int = 0
    domains: tuple[str, ...] = ("math", "code", "stem", "instruct")
    noise: float = 0.5  # fraction of SFT answers that are wrong: the imperfect teacher RL improves on
    sft_per_domain: int = 1000  # SFT records per domain (several traces per math prompt: multi-path)
    rl_per_domain: int = 256  # RL prompts per domain
    heldout_per_domain: int = 64  # held-out prompts per domain (the accuracy table, eval)
    probe_per_domain: int = 32  # probing prompts per domain (Pass@K checkpoint selection), disjoint from held-out
    vocab_size: int = 512  # SentencePiece vocabulary: exactly the model's (see run_data)


def plan_data(ctx: Context, section: dict, sdir: Path) -> Plan:
    _, rest = _split(section, {})
    cfg = to_dataclass(DataStage, rest, "config.stages.data")
    if not cfg.out:
        raise VtError("out: the directory for the synthetic data is not set")
    return Plan(cfg, [])


def run_data(ctx: Context, plan: Plan, sdir: Path) -> StageOutput:
    from vt.data.tasks import task_corpus, task_records, write_jsonl
    from vt.data.tokenizer import build_tiny_sentencepiece
    c: DataStage = plan.config
    out = Path(c.out)
    sft = []
    for d in c.domains:
        sft += task_records(d, c.sft_per_domain, c.seed, noise=c.noise)
    import numpy as np
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
    tok = build_tiny_sentencepiece(out / "tokenizer.model", task_corpus(c.seed), vocab_size=c.vocab_size)
    # SentencePiece refuses to decode an id beyond its vocabulary, and a model with a larger embedding can
    # sample one: the vocabularies must match exactly.
    if tok.vocab_size != c.vocab_size:
        raise VtError(f"the SentencePiece model has {tok.vocab_size} pieces, not vocab_size={c.vocab_size} "
                      f"(the corpus is too small for that many); the model could sample undecodable ids")
    return StageOutput(metrics={"sft_records": len(sft), "vocab_size": tok.vocab_size},
                       inputs={"generated_into": str(out)})


# --- SFT stages -------------------------------------------------------------------------------------------------

def _sft_config(ctx: Context, section: dict, stage: str, init: str, **wiring):
    from vt.train.sft import SftConfig
    _, rest = _split(section, {})
    cfg = to_dataclass(SftConfig, rest, f"config.stages.{stage}")
    changes = {"model.init_checkpoint": init, **wiring}
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


def run_sft(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.train.sft import train
    result = train(plan.config, sdir)
    if result.status != "finished":
        raise VtError(f"SFT in {sdir} stopped ({result.status}) at step {result.step}; re-run to resume")
    metrics = {k: result.last_metrics.get(k) for k in ("loss", "eval_loss", "grad_norm") if k in result.last_metrics}
    metrics["steps"] = result.step
    metrics["checkpoints"] = [str(p) for p in sealed_steps(sdir)]
    return StageOutput(checkpoint=_final_step_dir(sdir), metrics=metrics,
                       inputs={"init_checkpoint": plan.config.model.init_checkpoint, "train": plan.config.data.train,
                               "pass_rates": plan.config.data.hard_subset.pass_rates})


# --- profiling ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ProfileStage:
    data: str = ""  # prompts to profile ("" = sft1's training data, one prompt per prompt id)
    k: int = 8  # RECIPE: 8 rollouts per prompt
    max_new_tokens: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 64
    prompts_per_call: int = 64
    seed: int = 0
    limit: int = 0  # profile only the first N distinct prompts (0 = all)


def plan_profile(ctx, section, sdir) -> Plan:
    _, rest = _split(section, {})
    cfg = to_dataclass(ProfileStage, rest, "config.stages.profile")
    inputs = [("config.stages.profile.data", cfg.data, "data")] if cfg.data else []
    if not cfg.data and not ctx.enabled("sft1"):
        raise VtError("data: empty, and sft1 (whose training data it defaults to) is disabled")
    return Plan(cfg, inputs)


def run_profile(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.data import load_pass_rates
    from vt.rl.learner import load_records
    from vt.rl.profile import profile
    c: ProfileStage = plan.config
    data = c.data or ctx.cfg.stages["sft1"]["data"]["train"]
    seen, records = set(), []
    for r in load_records(data, "profile.data"):
        if r.prompt_id not in seen and (not c.limit or len(records) < c.limit):
            seen.add(r.prompt_id)
            records.append(r)
    prompts = _dump_records(records, sdir / "prompts.jsonl")
    ckpt = ctx.checkpoint_before("profile")
    out = sdir / "pass_rates.jsonl"
    profile(Path(ckpt), Path(ctx.cfg.tokenizer), str(prompts), out, k=c.k, temperature=c.temperature, top_p=c.top_p,
            max_new_tokens=c.max_new_tokens, batch_size=c.batch_size, prompts_per_call=c.prompts_per_call,
            seed=c.seed, progress=False)
    rates = load_pass_rates(out)
    vals = [r.pass_rate for r in rates.values()]
    return StageOutput(metrics={"prompts": len(vals), "mean_pass_rate": sum(vals) / max(1, len(vals)),
                                "never_solved": sum(v == 0 for v in vals), "always_solved": sum(v == 1 for v in vals)},
                       inputs={"checkpoint": ckpt, "data": data, "pass_rates": str(out)})


# --- Pass@K selection and merge -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SelectStage:
    pools: tuple[str, ...] = ("sft2",)  # SFT stages whose periodic checkpoints are the candidates
    probes: dict = dataclasses.field(default_factory=dict)  # domain -> probing prompts (verifiable)
    n: int = 8  # samples per probe
    k: int = 4  # Pass@K (RECIPE: selection by pass@k, not pass@1 or loss)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 4096
    batch_size: int = 64
    limit: int = 0  # probes per domain (0 = all)
    seed: int = 0


def plan_select(ctx, section, sdir) -> Plan:
    _, rest = _split(section, {})
    cfg = to_dataclass(SelectStage, rest, "config.stages.select")
    bad = [p for p in cfg.pools if p not in ("sft1", "sft2") or not ctx.enabled(p)]
    if bad or not cfg.pools:
        raise VtError(f"pools: {list(cfg.pools)}: need enabled SFT stages among sft1, sft2")
    if not cfg.probes:
        raise VtError("probes: no probing set (domain -> prompt file)")
    if not 1 <= cfg.k <= cfg.n:
        raise VtError(f"k={cfg.k} must be in [1, n={cfg.n}]")
    return Plan(cfg, [(f"config.stages.select.probes.{d}", p, "data") for d, p in cfg.probes.items()])


class _Verifier:
    """Engine + rewards for a set of domains, reused across checkpoints (weights swapped in place)."""

    def __init__(self, ctx: Context, domains, sampler_cfg):
        from vt.data import load_tokenizer
        from vt.rewards.registry import make_reward
        self.tokenizer = load_tokenizer(ctx.cfg.tokenizer)
        self.rewards = {d: make_reward(d) for d in domains}
        self.sampler_cfg, self.engine = sampler_cfg, None

    def load(self, ckpt: str) -> None:
        from flax import nnx

        from vt.checkpoint import load_model
        from vt.sampling.engine import Engine
        model = load_model(ckpt)
        if self.engine is None:
            self.engine = Engine(model, self.sampler_cfg, tokenizer=self.tokenizer)
        else:
            self.engine.update_weights(nnx.state(model))

    def score(self, records, domain: str, n: int, seed: int):
        from vt.rl.rollouts import rollout_and_score
        return rollout_and_score(self.engine, self.tokenizer, records, {domain: self.rewards[domain]},
                                 group_size=n, seed=seed, max_prompt_tokens=1 << 30, domain=domain)

    def close(self):
        for r in self.rewards.values():
            r.close()


def _load_limited(path: str, limit: int, where: str):
    from vt.rl.learner import load_records
    records = load_records(path, where)
    return records[:limit] if limit else records


def run_select(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.sampling.engine import SamplerConfig
    from vt.train.selection import distill, pass_at_k
    c: SelectStage = plan.config
    candidates = [p for pool in c.pools for p in sealed_steps(ctx.stage_dir(pool))]
    if not candidates:
        raise VtError(f"select: no checkpoints in {list(c.pools)}")
    probes = {d: _load_limited(p, c.limit, f"select.probes.{d}") for d, p in sorted(c.probes.items())}
    v = _Verifier(ctx, probes, SamplerConfig(batch_size=c.batch_size, max_new_tokens=c.max_new_tokens,
                                             temperature=c.temperature, top_p=c.top_p, seed=c.seed))

    def scorer(ckpt: Path) -> dict[str, float]:
        v.load(str(ckpt))
        out = {}
        for i, (d, recs) in enumerate(probes.items()):
            s = v.score(recs, d, c.n, seed=c.seed * 1000 + i)
            per = [pass_at_k(int(s.valid[q].sum()), int(s.correct[q].sum()), min(c.k, int(s.valid[q].sum())))
                   for q in range(len(recs)) if s.valid[q].any()]
            out[d] = sum(per) / max(1, len(per))
        log.info("select: %s %s", ckpt, out)
        return out

    try:
        report = distill(candidates, scorer, sdir / "merged")
    finally:
        v.close()
    return StageOutput(checkpoint=str(sdir / "merged"), metrics=report,
                       inputs={"candidates": [str(p) for p in candidates], "probes": dict(c.probes)})


# --- RL stages ----------------------------------------------------------------------------------------------------

RL_FIELDS = {"profile_k": 8, "profile_max_new_tokens": 0}


def plan_rl(stage: str):
    def plan(ctx, section, sdir) -> Plan:
        from vt.rl.learner import RLConfig
        own, rest = _split(section, dict(RL_FIELDS))
        cfg = to_dataclass(RLConfig, rest, f"config.stages.{stage}")
        wiring = {"model.init_checkpoint": ctx.checkpoint_before(stage), "data.tokenizer": ctx.cfg.tokenizer}
        if own["profile_k"] > 0:
            wiring["data.profile"] = str(sdir / "profile.jsonl")
        cfg = _replace(cfg, **wiring)
        if stage == "long2short" and cfg.mgpo.long2short_lambda <= 0:
            raise VtError("mgpo.long2short_lambda must be > 0 in the Long2Short stage (RECIPE: 0.2)")
        inputs = [(f"config.stages.{stage}.data.train", cfg.data.train, "data")]
        if cfg.data.eval:
            inputs.append((f"config.stages.{stage}.data.eval", cfg.data.eval, "data"))
        return Plan({"rl": cfg, **own}, inputs)
    return plan


def run_rl(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.rl.learner import train_rl
    cfg = plan.config["rl"]
    metrics: dict[str, Any] = {}
    if plan.config["profile_k"] > 0:  # RECIPE: drop prompts the phase's start always or never solves
        from vt.rl.profile import profile
        r = cfg.rollout.sampler
        profile(Path(cfg.model.init_checkpoint), Path(cfg.data.tokenizer), cfg.data.train, Path(cfg.data.profile),
                k=plan.config["profile_k"], domain=cfg.data.domain, temperature=r.temperature, top_p=r.top_p,
                max_new_tokens=plan.config["profile_max_new_tokens"] or r.max_new_tokens, batch_size=r.batch_size,
                max_prompt_tokens=cfg.data.max_prompt_tokens, seed=r.seed, progress=False)
        from vt.data import load_pass_rates
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
    rows = [json.loads(x) for x in (sdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "reward_mean" in r]
    if steps:
        k = max(1, len(steps) // 5)
        mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)  # noqa: E731
        metrics.update(reward_first=mean(steps[:k], "reward_mean"), reward_last=mean(steps[-k:], "reward_mean"),
                       response_len_first=mean(steps[:k], "response_len_mean"),
                       response_len_last=mean(steps[-k:], "response_len_mean"),
                       prompts_dropped=steps[-1].get("prompts_dropped", 0))
    metrics["steps"] = result.step
    metrics["eval_history"] = result.eval_history
    return StageOutput(checkpoint=_final_step_dir(sdir), metrics=metrics,
                       inputs={"init_checkpoint": cfg.model.init_checkpoint, "train": cfg.data.train,
                               "profile": cfg.data.profile})


# --- self-distillation --------------------------------------------------------------------------------------------

def _teacher(ctx: Context, domain: str) -> str:
    stages = {"math": ("long2short", "rl_math"), "code": ("rl_code",), "stem": ("rl_stem",)}[domain]
    for s in stages:
        if ctx.enabled(s):
            return ctx.output_of(s)["checkpoint"]
    return ""


def plan_self_distill(ctx, section, sdir) -> Plan:
    from vt.distill.pipeline import DOMAINS, SelfDistillConfig
    _, rest = _split(section, {})
    dcfg = to_dataclass(SelfDistillConfig, rest.pop("distill", {}), "config.stages.self_distill.distill")
    student = ctx.checkpoint_before("self_distill")
    changes = {"student": student, "tokenizer": ctx.cfg.tokenizer}
    for d in DOMAINS:
        if getattr(dcfg.sources, d).data:
            changes[f"sources.{d}.ckpt"] = _teacher(ctx, d)
    dcfg = _replace(dcfg, **changes)
    sft = _sft_config(ctx, rest.pop("sft", {}), "self_distill.sft", student,
                      **{"data.train": str(sdir / "distill" / "selected.jsonl")})
    if rest:
        raise VtError(f"unknown field(s) {sorted(rest)} (expected enabled, distill, sft)")
    inputs = [(f"config.stages.self_distill.distill.sources.{d}.data", getattr(dcfg.sources, d).data, "data")
              for d in DOMAINS if getattr(dcfg.sources, d).ckpt]
    if not inputs:
        raise VtError("distill.sources: no domain has both prompts and an enabled RL stage")
    return Plan({"distill": dcfg, "sft": sft}, inputs)


def _generator(ckpt: str, tokenizer_path: str, s, dtype: str):
    """vt.eval's EngineGenerator over an Engine that stops on the tokenizer's end-of-turn ids.

    (vt.eval.runner.build_generator builds its Engine without the tokenizer, so with a tokenizer whose
    <|im_end|> is not Qwen's id 151645, like the demo's, no sample would ever stop.)"""
    from vt.checkpoint import load_model
    from vt.data import load_tokenizer
    from vt.eval.generation import EngineGenerator
    from vt.sampling.engine import Engine, SamplerConfig
    tok = load_tokenizer(tokenizer_path)
    sc = SamplerConfig(batch_size=s.batch_size, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                       top_p=s.top_p, top_k=s.top_k, seed=s.seed, max_context=s.max_context or None,
                       stop_token_ids=tuple(tok.eos_token_ids))
    return EngineGenerator(Engine(load_model(ckpt, dtype=dtype), sc, tokenizer=tok), tok, s.max_new_tokens)


def run_self_distill(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.distill.pipeline import DOMAINS
    from vt.distill.pipeline import run_self_distill as distill
    from vt.train.sft import train
    d = plan.config["distill"]
    generators = {dom: _generator(getattr(d.sources, dom).ckpt, d.tokenizer, d.sampling, d.dtype)
                  for dom in DOMAINS if getattr(d.sources, dom).ckpt}
    report = distill(d, sdir / "distill", generators=generators)
    result = train(plan.config["sft"], sdir / "sft")
    if result.status != "finished":
        raise VtError(f"SFT in {sdir / 'sft'} stopped ({result.status}); re-run to resume")
    return StageOutput(checkpoint=_final_step_dir(sdir / "sft"),
                       metrics={"selection": report, "sft_steps": result.step,
                                "sft_loss": result.last_metrics.get("loss")},
                       inputs={"student": plan.config["distill"].student,
                               "teachers": {d: getattr(plan.config["distill"].sources, d).ckpt
                                            for d in ("math", "code", "stem")}})


# --- evaluation and export ----------------------------------------------------------------------------------------

def plan_eval(ctx, section, sdir) -> Plan:
    from vt.eval.runner import EvalConfig
    _, rest = _split(section, {})
    benchmarks = rest.pop("benchmarks", {})
    if rest:
        raise VtError(f"unknown field(s) {sorted(rest)} (expected enabled, benchmarks)")
    if not benchmarks:
        raise VtError("benchmarks: none configured")
    ckpt = ctx.checkpoint_before("eval")
    cfgs, inputs = {}, []
    for name, b in benchmarks.items():
        e = to_dataclass(EvalConfig, b, f"config.stages.eval.benchmarks.{name}")
        cfgs[name] = _replace(e, **{"model.ckpt": ckpt, "model.tokenizer": ctx.cfg.tokenizer})
        inputs.append((f"config.stages.eval.benchmarks.{name}.data", e.data, "data"))
    return Plan(cfgs, inputs)


def run_eval_stage(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.eval.runner import run_eval
    metrics = {}
    for name, cfg in plan.config.items():
        gen = _generator(cfg.model.ckpt, cfg.model.tokenizer, cfg.sampling, cfg.model.dtype)
        summary = run_eval(cfg, sdir / name, generator=gen)
        metrics[name] = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ckpt = next(iter(plan.config.values())).model.ckpt
    return StageOutput(metrics=metrics, inputs={"checkpoint": ckpt})


@dataclasses.dataclass(frozen=True)
class ExportStage:
    dtype: str = "bfloat16"  # safetensors dtype
    check_transformers: bool = False  # load the export with transformers and compare greedy text with vt's
    check_prompts: int = 8  # prompts from the probe data (first of each domain in turn)
    check_max_new_tokens: int = 32


def plan_export(ctx, section, sdir) -> Plan:
    _, rest = _split(section, {})
    cfg = to_dataclass(ExportStage, rest, "config.stages.export")
    if cfg.check_transformers and not ctx.cfg.probe.data:
        raise VtError("check_transformers needs prompts: config.probe.data is empty")
    return Plan(cfg, [])


def run_export(ctx, plan: Plan, sdir: Path) -> StageOutput:
    from vt.checkpoint import load_model
    from vt.checkpoint.params import export_to_hf
    c: ExportStage = plan.config
    ckpt = ctx.checkpoint_before("export")
    hf = sdir / "hf"
    tok = Path(ctx.cfg.tokenizer)
    shutil.rmtree(hf, ignore_errors=True)
    export_to_hf(load_model(ckpt), hf, dtype=c.dtype, tokenizer_dir=tok if tok.is_dir() else None)
    if tok.is_file():  # a SentencePiece model travels with the weights
        shutil.copy(tok, hf / "tokenizer.model")
    metrics: dict[str, Any] = {"hf_dir": str(hf)}
    if c.check_transformers:
        metrics.update(greedy_check(ctx, ckpt, hf, c, sdir / "greedy.jsonl"))
    return StageOutput(metrics=metrics, inputs={"checkpoint": ckpt}, checkpoint=None)


def greedy_check(ctx: Context, ckpt: str, hf: Path, c: ExportStage, out: Path) -> dict:
    """vt's sampler at temperature 0 and transformers' generate(do_sample=False) on the exported weights: the
    same token ids, hence the same text (both decoded with the pipeline's tokenizer)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from vt.checkpoint import load_model
    from vt.data import load_tokenizer
    from vt.sampling.engine import Engine, Request, SamplerConfig
    tok = load_tokenizer(ctx.cfg.tokenizer)
    per_domain = {d: _load_limited(p, c.check_prompts, f"probe.data.{d}")
                  for d, p in sorted(ctx.cfg.probe.data.items())}
    records = [r for group in zip(*per_domain.values()) for r in group][:c.check_prompts]
    prompts = [tok.encode_chat(list(r.prompt), add_generation_prompt=True) for r in records]
    sc = SamplerConfig(temperature=0.0, max_new_tokens=c.check_max_new_tokens, batch_size=max(8, len(prompts)),
                       stop_token_ids=tuple(tok.eos_token_ids))
    engine = Engine(load_model(ckpt, dtype="float32"), sc, tokenizer=tok)
    ours = [s[0].completion_ids for s in engine.generate([Request(prompt_ids=p) for p in prompts], seed=0)]
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    model.eval()
    stop = list(engine.stop_ids)
    rows, matches = [], 0
    for r, p, mine in zip(records, prompts, ours):
        with torch.no_grad():
            g = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=c.check_max_new_tokens,
                               eos_token_id=stop, pad_token_id=tok.pad_token_id,
                               attention_mask=torch.ones(1, len(p), dtype=torch.long))
        theirs = g[0, len(p):].tolist()
        theirs = theirs[: next((i + 1 for i, t in enumerate(theirs) if t in stop), len(theirs))]
        same = list(mine) == theirs
        matches += same
        rows.append({"id": r.id, "domain": r.domain, "prompt": r.prompt[-1]["content"], "same": same,
                     "vt": tok.decode(mine, skip_special_tokens=True),
                     "transformers": tok.decode(theirs, skip_special_tokens=True)})
    from vt.data.tasks import write_jsonl
    write_jsonl(out, rows)
    if matches != len(rows):
        bad = next(r for r in rows if not r["same"])
        raise VtError(f"transformers' greedy text differs from vt's on {len(rows) - matches}/{len(rows)} prompts, "
                      f"e.g. {bad['id']}: vt {bad['vt']!r} vs transformers {bad['transformers']!r} (see {out})")
    return {"greedy_match": f"{matches}/{len(rows)}", "greedy_samples": str(out),
            "mean_len": float(np.mean([len(x) for x in ours]))}


# --- held-out accuracy (the per-stage table) ----------------------------------------------------------------------

def heldout_accuracy(ctx: Context, ckpt: str, sdir: Path) -> dict[str, float]:
    """avg@n correctness per probe domain (binary: every test / constraint met), samples saved for inspection."""
    from vt.sampling.engine import SamplerConfig
    p = ctx.cfg.probe
    data = {d: _load_limited(path, p.limit, f"probe.data.{d}") for d, path in sorted(p.data.items())}
    v = _Verifier(ctx, data, SamplerConfig(batch_size=p.batch_size, max_new_tokens=p.max_new_tokens,
                                           temperature=p.temperature, top_p=p.top_p, seed=p.seed))
    acc, rows = {}, []
    try:
        v.load(ckpt)
        for i, (d, recs) in enumerate(data.items()):
            s = v.score(recs, d, p.n, seed=p.seed * 1000 + i)
            acc[d] = float(s.correct[s.valid].mean()) if s.valid.any() else float("nan")
            for q in range(min(4, len(recs))):
                rows.append({"domain": d, "prompt": recs[q].prompt[-1]["content"],
                             "samples": [x.text for x in s.samples[q][:2]], "correct": s.correct[q][:2].tolist()})
    finally:
        v.close()
    from vt.data.tasks import write_jsonl
    write_jsonl(sdir / "heldout_samples.jsonl", rows)
    return acc


PLANS = {"data": plan_data, "sft1": plan_sft1, "profile": plan_profile, "sft2": plan_sft2, "select": plan_select,
         **{s: plan_rl(s) for s in RL_STAGES}, "self_distill": plan_self_distill, "eval": plan_eval,
         "export": plan_export}
RUNS = {"data": run_data, "sft1": run_sft, "profile": run_profile, "sft2": run_sft, "select": run_select,
        **{s: run_rl for s in RL_STAGES}, "self_distill": run_self_distill, "eval": run_eval_stage,
        "export": run_export}
