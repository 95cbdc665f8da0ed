"""`vt self-distill --config configs/self_distill.py --workdir DIR`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from vt import VtError
from vt.checkpoint.seal import add_trust_flag
from vt.validation import check_output_path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "self-distill", help="stage 4: sample RL checkpoints, keep verified traces, S_LP-select an SFT set",
        description="Writes samples_<domain>/, scores.jsonl, selected.jsonl and selection_report.json into "
                    "--workdir; re-running resumes. Override any field with --config.key=value.")
    p.add_argument("--config", required=True, help="configs/self_distill.py[:variant]")
    p.add_argument("--workdir", required=True, type=Path)
    add_trust_flag(p)
    p.set_defaults(func=run, accepts_config_overrides=True)


def check_inputs(cfg) -> None:
    """Every input path the run reads, checked before anything loads, named by its config field (a variant such
    as `smoke` shrinks sizes, not inputs: it still needs a student, a tokenizer and a domain's checkpoint and
    data)."""
    paths = [("config.student", cfg.student), ("config.tokenizer", cfg.tokenizer)]
    for domain in ("math", "code", "stem"):
        src = getattr(cfg.sources, domain)
        if src.ckpt:  # "" = domain skipped
            paths += [(f"config.sources.{domain}.ckpt", src.ckpt), (f"config.sources.{domain}.data", src.data)]
    # data may also be a source spec (tfds:..., a glob, a comma list), which vt.data.open_source checks itself
    missing = [f"{name}={value!r}" for name, value in paths
               if not value or (not any(c in value for c in "*?[,:") and not Path(value).exists())]
    if missing:
        raise VtError(f"missing input(s): {', '.join(missing)}; set them with --config.FIELD=PATH "
                      "(see configs/self_distill.py)")


def run(args: argparse.Namespace) -> int:
    from vt.config import load_config, to_dataclass
    from vt.distill.run import SelfDistillConfig, run_self_distill

    check_output_path(args.workdir, "--workdir", directory=True)
    cfg = to_dataclass(SelfDistillConfig, load_config(args.config, args.config_overrides))
    check_inputs(cfg)
    report = run_self_distill(cfg, args.workdir)
    print(json.dumps(report["domains"], indent=1))
    print(f"{report['selected']} traces -> {args.workdir / 'selected.jsonl'}")
    return 0
