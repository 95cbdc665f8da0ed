"""`vt pipeline` (the whole recipe from a config) and `vt demo` (the same on a tiny model, CPU, minutes)."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from vt import VtError
from vt.checkpoint.seal import add_trust_flag
from vt.validation import check_output_path

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.py"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "pipeline", help="run the whole recipe: SFT -> profile -> SFT2 -> select/merge -> RL ... -> eval -> export",
        description="Each stage runs in WORKDIR/<stage>/ and writes a manifest.json when it finishes; re-running "
                    "skips finished stages and resumes an interrupted one. Override any field with "
                    "--config.key=value (stage fields: --config.stages.rl_math.train.steps=10).")
    p.add_argument("--config", required=True, help="configs/vibethinker_3b.py[:variant]")
    p.add_argument("--workdir", required=True, type=Path)
    _common(p)
    p.set_defaults(func=run_pipeline_cmd, accepts_config_overrides=True)

    d = subparsers.add_parser(
        "demo", help="the whole recipe on a tiny model trained from scratch on synthetic tasks (CPU, ~10 min)",
        description=f"Runs {DEMO_CONFIG.relative_to(DEMO_CONFIG.parents[1])} through `vt pipeline`: one line "
                    "per stage, then the held-out accuracy table, the final checkpoint, the Hugging Face export "
                    "and its transformers check, the eval summaries, plot.png and a TensorBoard command.")
    d.add_argument("--workdir", type=Path, default=Path("demo_out"))
    d.add_argument("--variant", default="", help="'' (the full demo), 'ci' (shorter), 'opd' (the full demo, then on-policy "
                        "distillation of its final model into the SFT-1 checkpoint) or 'tools' (SFT and RL with a python "
                        "tool in the rollout)")
    d.add_argument("--fresh", action="store_true",
                   help="delete WORKDIR first, if vt created it (never under --validate, only once the config "
                        "and its inputs are checked)")
    _common(d)
    d.set_defaults(func=run_demo_cmd, accepts_config_overrides=True)


def _common(p) -> None:
    # Stage names are checked by the handler, first thing, --validate included (the table of stages lives in
    # vt.recipe.stages, which imports the learners: too heavy for `vt --help`).
    p.add_argument("--from", dest="from_stage", metavar="STAGE",
                   help="discard STAGE and later stages, run them again")
    p.add_argument("--only", metavar="STAGE",
                   help="run only STAGE again (earlier stages must be finished)")
    p.add_argument("--until", metavar="STAGE",
                   help="run (or finish) the stages up to and including STAGE; leave the later ones alone")
    p.add_argument("--validate", action="store_true",
                   help="resolve every stage config and check every input path; run nothing")
    add_trust_flag(p)


def _no_progress_bars(cd) -> None:
    """Every `progress` field in the config's stage sections set to False (progress changes no result, and no
    stage fingerprint: vt.recipe.runner.fingerprint)."""
    for key in list(cd.keys()):
        value = cd[key]
        if key == "progress" and isinstance(value, bool):
            cd[key] = False
        elif hasattr(value, "keys"):
            _no_progress_bars(value)


def _run(spec: str, args, before_run=None, bars_only_on_a_terminal: bool = False) -> int:
    """Load and check the config; under --validate report and stop; else run, calling `before_run` once every
    flag and input is checked (vt demo --fresh: only then is the old work directory deleted)."""
    from vt.config import load_config
    from vt.recipe.report import print_validation
    from vt.recipe.runner import check_stage_flag, recipe_config, run_pipeline, validate
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    check_stage_flag("--from", args.from_stage)
    check_stage_flag("--only", args.only)
    check_stage_flag("--until", args.until)
    check_output_path(args.workdir, "--workdir", directory=True)
    cd = load_config(spec, args.config_overrides)
    if bars_only_on_a_terminal and not sys.stderr.isatty():
        _no_progress_bars(cd)  # piped or logged (make demo | tee): the stage lines only, no \r-updated bars
    cfg = recipe_config(cd, args.workdir)
    out = _unbuffered_stdout
    if args.validate:
        out(f"validating {spec} (work directory {args.workdir})")
        return 0 if print_validation(validate(cfg, args.workdir.absolute()), out) else 1
    run_pipeline(cfg, args.workdir, from_stage=args.from_stage, only=args.only, until=args.until, out=out,
                 before_start=before_run)
    return 0


def _unbuffered_stdout(line: str) -> None:  # no buffering surprises when piped (make demo | tee)
    print(line, file=sys.stdout, flush=True)


def run_pipeline_cmd(args: argparse.Namespace) -> int:
    return _run(args.config, args)


def run_demo_cmd(args: argparse.Namespace) -> int:
    from vt.checkpoint.io import remove_created_dir
    if not DEMO_CONFIG.is_file():
        raise VtError(f"{DEMO_CONFIG}: the demo config is missing (vt demo runs from a source checkout)")

    def fresh():  # vt deletes only what it created (vt.checkpoint.io), after validation, never under --validate
        if remove_created_dir(args.workdir, "--fresh"):
            print(f"[demo] --fresh: deleted {args.workdir}", flush=True)
    t0 = time.perf_counter()
    rc = _run(f"{DEMO_CONFIG}:{args.variant}" if args.variant else str(DEMO_CONFIG), args,
              before_run=fresh if args.fresh else None, bars_only_on_a_terminal=True)
    if not args.validate:
        print(f"[demo] wall time {time.perf_counter() - t0:.0f} s. Next: README's \"After the demo\" (sample, "
              f"evaluate, load in transformers)", flush=True)
    return rc
