"""`vt merge` (`vt train` is vt.learners.commands)."""
from __future__ import annotations

import argparse
from pathlib import Path

from vt import VtError
from vt.checkpoint.seal import add_trust_flag
from vt.validation import check_output_path


def register(subparsers) -> None:
    m = subparsers.add_parser("merge", help="average vt checkpoints at the parameter level",
                              description="Merge model checkpoints (or learner step directories) into one: "
                                          "out = sum_i w_i * params_i, weights normalised to sum to 1.")
    m.add_argument("ckpts", nargs="+", type=Path, help="checkpoint directories (same architecture)")
    m.add_argument("--out", required=True, type=Path, help="output checkpoint directory (must not exist)")
    m.add_argument("--weights", default=None,
                   help="comma-separated non-negative weights, one per checkpoint (default: uniform)")
    add_trust_flag(m)
    m.set_defaults(func=run_merge)


def run_merge(args: argparse.Namespace) -> int:
    from vt.train.merge import merge_checkpoints

    weights = None
    if args.weights is not None:
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            raise VtError(f"--weights {args.weights!r}: expected comma-separated numbers") from None
    check_output_path(args.out, "--out", directory=True)
    used = merge_checkpoints(args.ckpts, args.out, weights)
    print(f"wrote {args.out} = " + " + ".join(f"{w:.4g} * {c}" for c, w in zip(args.ckpts, used)))
    return 0
