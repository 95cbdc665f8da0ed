"""The recipe runner: validate every stage, then run the enabled ones in order in one work directory.

    cfg = recipe_config(load_config("configs/vibethinker_3b.py"), workdir)
    report = validate(cfg, workdir)       # every stage's typed config and every input path; runs nothing
    manifests = run_pipeline(cfg, workdir)

Work directory: `<stage>/` per stage with `manifest.json` (inputs, resolved config, checkpoint, metrics,
held-out accuracy, wall time), written last and atomically: a stage with a manifest is finished and is
skipped on a re-run; a stage without one was interrupted and is run again, and the learners inside resume
from their own checkpoints (SFT and RL restore bitwise on CPU), so a killed pipeline re-run gives the results a
straight run gives. `from_stage` discards that stage and everything after it and re-runs them; `only` re-runs
just that stage (its inputs must be finished). vt.recipe.report writes the table, plot and TensorBoard logs.

Strings in the config may say `{workdir}`: it is replaced by the work directory (the demo's data lives there).
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable


from vt import VtError
from vt.checkpoint.io import claim_dir
from vt.config import to_dataclass
from vt.distributed import enable_compilation_cache, is_primary
from vt.io import atomic_write_json
from vt.recipe.report import write_outputs
from vt.recipe.stages import (MANIFEST, STAGE_BY_NAME, STAGE_NAMES, Context, Plan, RecipeConfig, StageOutput,
                              heldout_accuracy, stage_logging)
from vt.tracking.wandb import log_summary


PLAN_FILE = "pipeline.json"  # the enabled stages in order (vt.checkpoint.commands.describe_pipeline reads it)


def substitute(obj, workdir: Path):
    if isinstance(obj, str):
        return obj.replace("{workdir}", str(workdir))
    if isinstance(obj, dict):
        return {k: substitute(v, workdir) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(substitute(v, workdir) for v in obj)
    return obj


def recipe_config(cd, workdir: Path | str) -> RecipeConfig:
    """ConfigDict (or dict) -> RecipeConfig, `{workdir}` substituted; stage names checked."""
    data = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
    data = substitute(data, Path(workdir).absolute())
    unknown = sorted(set(data.get("stages", {})) - set(STAGE_NAMES))
    if unknown:
        raise VtError(f"config.stages: unknown stage(s) {unknown}; known: {list(STAGE_NAMES)}")
    return to_dataclass(RecipeConfig, data)


def check_stage_flag(flag: str, value: str | None) -> None:
    """VtError unless `value` (of --from / --only / --until) names a stage."""
    if value is not None and value not in STAGE_NAMES:
        raise VtError(f"{flag} {value}: not a stage; stages: {', '.join(STAGE_NAMES)}")


# --- validation -------------------------------------------------------------------------------------------------

def _check_spec(spec: str) -> str | None:
    """None if every part of a data spec (comma list, globs, tfds:) names something that exists."""
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


def validate(cfg: RecipeConfig, workdir: Path, stages: list[str] | None = None) -> dict[str, Any]:
    """Resolve every stage's config (types and fields checked) and check every input path, running nothing.

    Returns {"stages": {stage: resolved config}, "problems": [...]}; paths a finished stage or the data stage
    will produce count as present."""
    ctx = Context(cfg, workdir, dry=True)
    stages = stages or [s for s in STAGE_NAMES if ctx.enabled(s)]
    inputs: list[tuple[str, str, str]] = [("config.tokenizer", cfg.tokenizer, "tokenizer")]
    if ctx.enabled("sft1") and cfg.base_checkpoint:
        inputs.append(("config.base_checkpoint", cfg.base_checkpoint, "checkpoint"))
    for domain, path in cfg.probe.data.items():
        inputs.append((f"config.probe.data.{domain}", path, "data"))
    resolved, problems = {}, []
    for stage in stages:
        try:
            plan = ctx.plan(stage)
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

def plain_config(config):
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    if isinstance(config, dict):
        return {k: plain_config(v) for k, v in config.items()}
    return config


def _without_logging(obj):
    if isinstance(obj, dict):
        return {k: _without_logging(v) for k, v in obj.items() if k not in ("logging", "progress")}
    return obj


def fingerprint(config, workdir: Path) -> str:
    """Hash of a stage's resolved config; the work directory's own path is left out, so it can move, and so are
    the `logging` sections and `progress` flags (W&B on or off, a progress bar or not, change no result)."""
    text = json.dumps(_without_logging(plain_config(config)), sort_keys=True, default=str)
    text = text.replace(str(workdir), "{workdir}")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_pipeline(cfg: RecipeConfig, workdir: Path | str, *, from_stage: str | None = None,
                 only: str | None = None, until: str | None = None, out=print, before_start=None) -> list[dict]:
    """Run (or finish) the recipe in `workdir` (up to and including stage `until`, when given); returns the
    manifests of the enabled stages that have one, in order.
    `before_start` runs once every flag and input is checked, before anything is written (`vt demo --fresh`)."""
    workdir = Path(workdir).absolute()
    check_stage_flag("--from", from_stage)
    check_stage_flag("--only", only)
    check_stage_flag("--until", until)
    ctx = Context(cfg, workdir)
    enabled = [s for s in STAGE_NAMES if ctx.enabled(s)]
    todo = [only] if only else enabled[enabled.index(from_stage):] if from_stage in enabled else enabled
    for flag, stage in (("--only", only), ("--from", from_stage), ("--until", until)):
        if stage and not ctx.enabled(stage):
            raise VtError(f"{flag} {stage}: the stage is disabled in this config")
    if until:
        first = only or from_stage
        if first and enabled.index(first) > enabled.index(until):
            raise VtError(f"--until {until} comes before {'--only' if only else '--from'} {first}")
        todo = [s for s in todo if enabled.index(s) <= enabled.index(until)]
    # Fail at once, before hours of SFT, when an input of any stage to run is missing.
    report = validate(cfg, workdir, todo)
    if report["problems"]:
        raise VtError("missing or invalid inputs:\n  " + "\n  ".join(report["problems"]))
    if before_start is not None:
        before_start()
    claim_dir(workdir, "vt pipeline")  # marks it as vt's: `vt demo --fresh` deletes only such a directory
    atomic_write_json(workdir / PLAN_FILE, {"name": cfg.name, "stages": enabled})  # `vt info WORKDIR` reads it
    if cfg.compilation_cache:
        enable_compilation_cache(cfg.compilation_cache, min_compile_time_s=0.5)
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
        plan = ctx.plan(stage)
        fp = fingerprint(plan.config, workdir)
        if m is not None:
            if m.get("fingerprint") != fp:
                raise VtError(f"stage {stage!r} finished in {ctx.stage_dir(stage)} with a different config; "
                              f"re-run it with --from {stage} (discards it and the stages after it)")
            out(f"[pipeline] {stage}: done, skipped")
            manifests.append(m)
            continue
        m = run_stage(ctx, stage, plan, fp, out, f"{enabled.index(stage) + 1}/{len(enabled)}")
        manifests.append(m)
    write_outputs(workdir, cfg, manifests, out)  # the held-out table once, then where every result is
    return manifests


def run_stage(ctx: Context, stage: str, plan: Plan, fp: str, out, position: str = "") -> dict:
    """Run one stage: one line as it starts, one as it ends (its time, checkpoint and held-out mean); a
    learner's progress bar, if its config turns one on, in between."""
    sdir = ctx.stage_dir(stage)
    sdir.mkdir(parents=True, exist_ok=True)
    resumed = any(p.name != MANIFEST for p in sdir.iterdir())
    out(f"[pipeline] {stage}: {'resuming' if resumed else 'running'} in {sdir}" +
        (f" (stage {position})" if position else ""))
    t0 = time.perf_counter()
    result: StageOutput = STAGE_BY_NAME[stage].run(ctx, plan, sdir)
    heldout = {}
    if STAGE_BY_NAME[stage].trains_model and ctx.cfg.probe.data and result.checkpoint:
        heldout = heldout_accuracy(ctx, result.checkpoint, sdir)
    ckpt = result.checkpoint
    if ckpt and Path(ckpt).is_relative_to(ctx.workdir):
        ckpt = str(Path(ckpt).relative_to(ctx.workdir))
    manifest = {"stage": stage, "status": "done", "fingerprint": fp, "wall_s": round(time.perf_counter() - t0, 1),
                "resumed": resumed, "inputs": result.inputs, "checkpoint": ckpt,
                "metrics": result.metrics, "heldout": heldout, "config": plain_config(plan.config),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(sdir / MANIFEST, manifest)
    if is_primary():  # the stage's results as its W&B run's summary (the learner's run, when one trained)
        log_summary(stage_logging(ctx, stage), result.learner_dir or sdir,
                    {"wall_s": manifest["wall_s"], "heldout": heldout, **result.metrics},
                    config=manifest["config"], job_type=stage)
    notes = [f"checkpoint {ckpt}"] if ckpt else []
    if heldout:
        accs = [v for d, v in heldout.items() if "/" not in d]  # accuracies, not tool_calls_ok/<domain>
        notes.append(f"held-out mean {sum(accs) / max(1, len(accs)):.3f}")
    out(f"[pipeline] {stage}: done in {manifest['wall_s']:.0f} s" + (f"; {', '.join(notes)}" if notes else ""))
    return manifest
