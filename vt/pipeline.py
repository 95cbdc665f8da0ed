"""The multi-stage recipe runner: the whole VibeThinker post-training recipe in one work directory.

    vt pipeline --config configs/vibethinker_3b.py --workdir runs/vibethinker      # or run_pipeline(cfg, workdir)
    vt pipeline --config configs/vibethinker_3b.py --workdir runs/x --validate     # check every input, run nothing
    vt demo                                                                        # configs/demo.py, tiny, CPU

Stages, in order (vt.pipeline_stages implements each; a config section per stage, `enabled` to skip one):

    data          demo only: the synthetic verifiable tasks and a SentencePiece tokenizer trained on them
    sft1          SFT stage 1 on all data (vt.train.sft), periodic checkpoints
    profile       pass rates of sft1's final checkpoint on the SFT prompts (vt.rl.profile)
    sft2          SFT stage 2 from sft1 on the hard subset the profile selects
    select        Pass@K per domain of sft2's checkpoints, best per domain, parameter merge (vt.train.selection)
    rl_math       MGPO on math (vt.rl.learner); each RL stage first profiles its start and drops p in {0, 1}
    long2short    MGPO on math with Long2Short shaping (mgpo.long2short_lambda > 0)
    rl_code       MGPO on code, unit tests in the sandbox
    rl_stem       MGPO on STEM (answer and option matching)
    self_distill  sample the math/code/STEM RL checkpoints, keep verified traces, S_LP band selection
                  (vt.distill), SFT the student (the rl_stem checkpoint) on them
    rl_instruct   MGPO on instruction following (rule rewards)
    eval          vt.eval benchmarks on the final checkpoint
    export        Hugging Face export; optionally transformers' greedy text checked against vt's

Each stage's checkpoint feeds the next stage that trains (a disabled stage passes its input through).

Work directory: `<stage>/` per stage with `manifest.json` (inputs, resolved config, checkpoint, metrics,
held-out accuracy, wall time), written last and atomically: a stage with a manifest is finished and is
skipped on a re-run; a stage without one was interrupted and is run again, and the learners inside resume
from their own checkpoints (SFT and RL restore bitwise on CPU), so a killed pipeline re-run gives the results a
straight run gives. `--from STAGE` discards STAGE and everything after it and re-runs them; `--only STAGE`
re-runs just that stage (its inputs must be finished). Also: `table.md` (held-out accuracy per domain after
each stage), `plot.png` (RL reward and held-out accuracy), `tb/` (the same, for TensorBoard; every learner
writes its own `tb/` in its stage directory).

Strings in the config may say `{workdir}`: it is replaced by the work directory (the demo's data lives there).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from vt import VtError

log = logging.getLogger(__name__)

STAGES = ("data", "sft1", "profile", "sft2", "select", "rl_math", "long2short", "rl_code", "rl_stem",
          "self_distill", "rl_instruct", "eval", "export")
# Stages whose output is a model checkpoint (the next training stage starts from it).
MODEL_STAGES = ("sft1", "sft2", "select", "rl_math", "long2short", "rl_code", "rl_stem", "self_distill",
                "rl_instruct")
MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class Probe:
    """The held-out accuracy table: avg@n of each domain's prompts after every stage that trains."""
    data: dict = dataclasses.field(default_factory=dict)  # domain -> prompt file ({} = no table)
    n: int = 4  # samples per prompt
    temperature: float = 1.0  # RECIPE evaluation temperature
    top_p: float = 1.0
    max_new_tokens: int = 64
    batch_size: int = 256  # decode slots
    limit: int = 64  # prompts per domain (0 = all)
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    name: str = "pipeline"
    base_checkpoint: str = ""  # vt checkpoint sft1 starts from ("" = random init of sft1.model.preset: demo)
    tokenizer: str = ""  # HF tokenizer directory or SentencePiece .model, shared by every stage
    compilation_cache: str = ""  # JAX persistent compilation cache directory ("" = off)
    probe: Probe = Probe()
    stages: dict = dataclasses.field(default_factory=dict)  # stage name -> its section (see vt.pipeline_stages)


@dataclasses.dataclass
class StageOutput:
    checkpoint: str | None = None
    metrics: dict = dataclasses.field(default_factory=dict)
    inputs: dict = dataclasses.field(default_factory=dict)
    config: Any = None


def substitute(obj, workdir: Path):
    if isinstance(obj, str):
        return obj.replace("{workdir}", str(workdir))
    if isinstance(obj, dict):
        return {k: substitute(v, workdir) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(substitute(v, workdir) for v in obj)
    return obj


def pipeline_config(cd, workdir: Path | str) -> PipelineConfig:
    """ConfigDict (or dict) -> PipelineConfig, `{workdir}` substituted; stage names checked."""
    from vt.config import to_dataclass
    data = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
    data = substitute(data, Path(workdir).absolute())
    unknown = sorted(set(data.get("stages", {})) - set(STAGES))
    if unknown:
        raise VtError(f"config.stages: unknown stage(s) {unknown}; known: {list(STAGES)}")
    return to_dataclass(PipelineConfig, data)


class Context:
    """What a stage sees: the config, the work directory, finished stages' manifests."""

    def __init__(self, cfg: PipelineConfig, workdir: Path, dry: bool = False):
        self.cfg, self.workdir, self.dry = cfg, workdir, dry

    def section(self, stage: str) -> dict:
        return dict(self.cfg.stages.get(stage, {}))

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
        for prev in reversed([s for s in MODEL_STAGES if STAGES.index(s) < STAGES.index(stage)]):
            if self.enabled(prev):
                return self.output_of(prev)["checkpoint"]
        if not self.cfg.base_checkpoint and stage != "sft1":
            raise VtError(f"stage {stage!r}: no earlier stage trains a model and base_checkpoint is empty")
        return self.cfg.base_checkpoint


# --- validation -------------------------------------------------------------------------------------------------

def _check_spec(spec: str) -> str | None:
    """None if every part of a data spec (comma list, globs, tfds:) names something that exists."""
    import glob
    for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
        if part.startswith("tfds:"):
            continue
        path = part.split(":", 1)[1] if part.startswith("arrayrecord:") else part
        if any(c in path for c in "*?["):
            if not glob.glob(path):
                return f"no file matches {path}"
        elif not Path(path).exists():
            return f"{path} does not exist"
    return None


def check_inputs(inputs: list[tuple[str, str, str]], made_by_pipeline: Callable[[str], bool]) -> list[str]:
    """inputs: (field, path, kind) with kind data | checkpoint | tokenizer. Returns one line per problem."""
    problems = []
    for field, path, kind in inputs:
        if not path:
            problems.append(f"{field}: not set ({kind})")
            continue
        if made_by_pipeline(path):
            continue
        why = _check_spec(path) if kind == "data" else (None if Path(path).exists() else f"{path} does not exist")
        if why is None and kind == "checkpoint" and not (Path(path) / "model_config.json").is_file():
            why = f"{path} is not a vt checkpoint (no model_config.json; convert with vt convert hf-to-orbax)"
        hf_dir_without_json = Path(path).is_dir() and not (Path(path) / "tokenizer.json").is_file()
        if why is None and kind == "tokenizer" and hf_dir_without_json:
            why = f"{path} has no tokenizer.json"
        if why:
            problems.append(f"{field}: {why} ({kind})")
    return problems


def validate(cfg: PipelineConfig, workdir: Path, stages: list[str] | None = None) -> dict[str, Any]:
    """Resolve every stage's config (types and fields checked) and check every input path, running nothing.

    Returns {"stages": {stage: resolved config}, "problems": [...]}; paths a finished stage or the data stage
    will produce count as present."""
    from vt import pipeline_stages as S
    ctx = Context(cfg, workdir, dry=True)
    stages = stages or [s for s in STAGES if ctx.enabled(s)]
    inputs: list[tuple[str, str, str]] = [("config.tokenizer", cfg.tokenizer, "tokenizer")]
    if ctx.enabled("sft1") and cfg.base_checkpoint:
        inputs.append(("config.base_checkpoint", cfg.base_checkpoint, "checkpoint"))
    for domain, path in cfg.probe.data.items():
        inputs.append((f"config.probe.data.{domain}", path, "data"))
    resolved, problems = {}, []
    for stage in stages:
        try:
            plan = S.PLANS[stage](ctx, ctx.section(stage), ctx.stage_dir(stage))
        except VtError as e:
            problems.append(f"config.stages.{stage}: {e}")
            continue
        resolved[stage] = plan.config
        inputs += plan.inputs
    data_stage = ctx.enabled("data")
    inside = str(workdir.absolute())

    def made(path: str) -> bool:  # the data stage writes the demo's inputs into the work directory
        return data_stage and str(Path(path).absolute()).startswith(inside)

    problems += check_inputs(inputs, made)
    return {"stages": resolved, "problems": problems}


# --- running ----------------------------------------------------------------------------------------------------

def fingerprint(config, workdir: Path) -> str:
    """Hash of a stage's resolved config; the work directory's own path is left out, so it can move."""
    text = json.dumps(_plain_config(config), sort_keys=True, default=str).replace(str(workdir), "{workdir}")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(path)


def _plain_config(config):
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    if isinstance(config, dict):
        return {k: _plain_config(v) for k, v in config.items()}
    return config


def run_pipeline(cfg: PipelineConfig, workdir: Path | str, *, from_stage: str | None = None,
                 only: str | None = None, out=print, before_start=None) -> list[dict]:
    """Run (or finish) the pipeline in `workdir`; returns the manifests of the enabled stages, in order.
    `before_start` runs once every flag and input is checked, before anything is written (`vt demo --fresh`)."""
    from vt import pipeline_stages as S
    from vt.checkpoint.io import claim_dir
    workdir = Path(workdir).absolute()
    for name, value in (("--from", from_stage), ("--only", only)):
        if value is not None and value not in STAGES:
            raise VtError(f"{name} {value}: not a stage; stages: {', '.join(STAGES)}")
    ctx = Context(cfg, workdir)
    enabled = [s for s in STAGES if ctx.enabled(s)]
    todo = [only] if only else enabled[enabled.index(from_stage):] if from_stage in enabled else enabled
    if (only or from_stage) and not ctx.enabled(only or from_stage):
        raise VtError(f"stage {only or from_stage!r} is disabled in this config")
    # Fail at once, before hours of SFT, when an input of any stage to run is missing.
    report = validate(cfg, workdir, todo)
    if report["problems"]:
        raise VtError("missing or invalid inputs:\n  " + "\n  ".join(report["problems"]))
    if before_start is not None:
        before_start()
    claim_dir(workdir, "vt pipeline")  # marks it as vt's: `vt demo --fresh` deletes only such a directory
    if cfg.compilation_cache:
        import jax
        jax.config.update("jax_compilation_cache_dir", cfg.compilation_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    redo = todo if only else (todo if from_stage else [])
    for stage in redo:  # --from / --only: discard those stages' results and run them again
        if ctx.stage_dir(stage).exists():
            out(f"[pipeline] discarding {ctx.stage_dir(stage)}")
            shutil.rmtree(ctx.stage_dir(stage))
    manifests = []
    for stage in enabled:
        if stage not in todo:
            m = ctx.manifest(stage)
            if m is not None:
                manifests.append(m)
            continue
        m = ctx.manifest(stage)
        plan = S.PLANS[stage](ctx, ctx.section(stage), ctx.stage_dir(stage))
        fp = fingerprint(plan.config, workdir)
        if m is not None:
            if m.get("fingerprint") != fp:
                raise VtError(f"stage {stage!r} finished in {ctx.stage_dir(stage)} with a different config; "
                              f"re-run it with --from {stage} (discards it and the stages after it)")
            out(f"[pipeline] {stage}: done, skipped")
            manifests.append(m)
            continue
        m = run_stage(ctx, stage, plan, fp, out)
        manifests.append(m)
        if m.get("heldout"):
            out(format_table(manifests, cfg))
    write_outputs(ctx, manifests, out)
    return manifests


def run_stage(ctx: Context, stage: str, plan, fp: str, out) -> dict:
    from vt import pipeline_stages as S
    sdir = ctx.stage_dir(stage)
    sdir.mkdir(parents=True, exist_ok=True)
    resumed = any(p.name != MANIFEST for p in sdir.iterdir())
    out(f"[pipeline] {stage}: {'resuming' if resumed else 'running'} in {sdir}")
    t0 = time.perf_counter()
    result: StageOutput = S.RUNS[stage](ctx, plan, sdir)
    heldout = {}
    if stage in MODEL_STAGES and ctx.cfg.probe.data and result.checkpoint:
        heldout = S.heldout_accuracy(ctx, result.checkpoint, sdir)
    ckpt = result.checkpoint
    if ckpt and Path(ckpt).is_relative_to(ctx.workdir):
        ckpt = str(Path(ckpt).relative_to(ctx.workdir))
    manifest = {"stage": stage, "status": "done", "fingerprint": fp, "wall_s": round(time.perf_counter() - t0, 1),
                "resumed": resumed, "inputs": result.inputs, "checkpoint": ckpt,
                "metrics": result.metrics, "heldout": heldout, "config": _plain_config(plan.config),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write_json(sdir / MANIFEST, manifest)
    out(f"[pipeline] {stage}: done in {manifest['wall_s']:.0f} s" +
        (f"; checkpoint {result.checkpoint}" if result.checkpoint else ""))
    return manifest


# --- reports ----------------------------------------------------------------------------------------------------

def table_rows(manifests: list[dict]) -> tuple[list[str], list[tuple[str, dict, float]]]:
    domains = sorted({d for m in manifests for d in m.get("heldout", {})})
    rows = [(m["stage"], m.get("heldout", {}), m.get("wall_s", 0.0)) for m in manifests if m.get("heldout")]
    return domains, rows


def format_table(manifests: list[dict], cfg: PipelineConfig | None = None) -> str:
    domains, rows = table_rows(manifests)
    head = "| stage | " + " | ".join(domains) + " | mean | stage s |"
    lines = ["held-out accuracy (avg@n per domain)" + (f", {cfg.probe.n} samples/prompt at T={cfg.probe.temperature}"
                                                       if cfg else ""),
             head, "|" + "---|" * (len(domains) + 3)]
    for stage, acc, wall in rows:
        vals = [acc.get(d) for d in domains]
        mean = sum(v for v in vals if v is not None) / max(1, sum(v is not None for v in vals))
        lines.append(f"| {stage} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in vals) +
                     f" | {mean:.3f} | {wall:.0f} |")
    return "\n".join(lines)


def rl_curves(workdir: Path, manifests: list[dict]) -> list[tuple[str, list[dict]]]:
    """(stage, metrics rows with a reward) for every RL stage, in order."""
    out = []
    for m in manifests:
        path = workdir / m["stage"] / "metrics.jsonl"
        if m["stage"].startswith("rl_") or m["stage"] == "long2short":
            if path.is_file():
                rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
                out.append((m["stage"], [r for r in rows if "reward_mean" in r]))
    return out


def write_outputs(ctx: Context, manifests: list[dict], out) -> None:
    table = format_table(manifests, ctx.cfg)
    (ctx.workdir / "table.md").write_text(table + "\n")
    summary = {"stages": [{k: m.get(k) for k in ("stage", "wall_s", "checkpoint", "heldout", "metrics")}
                          for m in manifests],
               "total_wall_s": round(sum(m.get("wall_s", 0.0) for m in manifests), 1)}
    _write_json(ctx.workdir / "summary.json", summary)
    try:
        plot(ctx.workdir, manifests)
        write_tensorboard(ctx.workdir, manifests)
    except ImportError as e:  # matplotlib / tensorboardX are optional for a headless run
        log.warning("plots skipped: %s", e)
    out(table)
    out(f"[pipeline] total {summary['total_wall_s']:.0f} s of stage time; results in {ctx.workdir}")


def plot(workdir: Path, manifests: list[dict]) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    offset = 0
    for stage, rows in rl_curves(workdir, manifests):
        xs = [offset + r["step"] for r in rows]
        a.plot(xs, [r["reward_mean"] for r in rows], label=stage)
        offset = xs[-1] if xs else offset
    a.set_xlabel("RL step (stages concatenated)")
    a.set_ylabel("mean reward of the rollouts")
    a.set_title("RL training reward")
    if a.lines:
        a.legend(fontsize=8)
    domains, rows = table_rows(manifests)
    for d in domains:
        b.plot(range(len(rows)), [acc.get(d, float("nan")) for _, acc, _ in rows], marker="o", label=d)
    b.set_xticks(range(len(rows)), [s for s, _, _ in rows], rotation=35, ha="right", fontsize=8)
    b.set_ylabel("held-out accuracy")
    b.set_ylim(0, 1)
    b.set_title("held-out accuracy after each stage")
    if domains:
        b.legend(fontsize=8)
    fig.tight_layout()
    path = workdir / "plot.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_tensorboard(workdir: Path, manifests: list[dict]) -> None:
    from tensorboardX import SummaryWriter
    shutil.rmtree(workdir / "tb", ignore_errors=True)
    w = SummaryWriter(str(workdir / "tb"))
    _, rows = table_rows(manifests)
    for i, (stage, acc, _) in enumerate(rows):
        for d, v in acc.items():
            w.add_scalar(f"heldout_accuracy/{d}", v, i)
    offset = 0
    for stage, rl_rows in rl_curves(workdir, manifests):
        for r in rl_rows:
            w.add_scalar("rl/reward_mean", r["reward_mean"], offset + r["step"])
            if "accuracy" in r:
                w.add_scalar("rl/accuracy", r["accuracy"], offset + r["step"])
        offset += rl_rows[-1]["step"] if rl_rows else 0
    w.close()


def print_validation(report: dict, out=print) -> bool:
    for stage in report["stages"]:
        out(f"  {stage}: config ok")
    if report["problems"]:
        out(f"{len(report['problems'])} problem(s):")
        for p in report["problems"]:
            out(f"  {p}")
        return False
    out("all inputs present; every stage config is valid")
    return True


def main_stream():  # stdout without buffering surprises when piped (make demo | tee)
    return lambda s: print(s, file=sys.stdout, flush=True)
