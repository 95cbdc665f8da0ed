"""`vt eval --config configs/eval_*.py --ckpt DIR --out DIR`."""
from __future__ import annotations

import argparse
from pathlib import Path

from vt.checkpoint.seal import add_trust_flag
from vt.validation import check_output_path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a checkpoint on a benchmark (pass@1, pass@k, maj@k, optional CLR)",
        description="Sample n completions per problem, score them, write results.jsonl, summary.{json,md} and "
                    "plot.png into --out. Re-running with the same --out resumes. Override any field with "
                    "--config.key=value.")
    p.add_argument("--config", required=True, help="configs/eval_*.py[:variant]")
    p.add_argument("--ckpt", default=None, help="vt checkpoint directory (sets config.model.ckpt)")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer directory (sets config.model.tokenizer)")
    p.add_argument("--out", required=True, type=Path, help="output directory (resumed when it exists)")
    add_trust_flag(p)
    p.set_defaults(func=run, accepts_config_overrides=True)


def run(args: argparse.Namespace) -> int:
    from vt.config import load_config, to_dataclass
    from vt.eval.runner import EvalConfig, run_eval

    check_output_path(args.out, "--out", directory=True)
    overrides = list(args.config_overrides)
    if args.ckpt is not None:
        overrides.append(f"--config.model.ckpt={args.ckpt}")
    if args.tokenizer is not None:
        overrides.append(f"--config.model.tokenizer={args.tokenizer}")
    cfg = to_dataclass(EvalConfig, load_config(args.config, overrides))
    summary = run_eval(cfg, args.out)
    from vt.distributed import is_primary
    if is_primary():  # the one process that wrote the report
        print((args.out / "summary.md").read_text().rstrip())
        print(f"{summary['problems']} problems; results in {args.out}")
    return 0
