"""`vt plan`."""
from __future__ import annotations

import argparse
from pathlib import Path

from vt import VtError
from vt.validation import check_output_path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan", help="compile a config's programs for a TPU slice or NVIDIA GPUs (none needed) and check they fit",
        description="Compile every device program of a stage config (SFT: the train step; RL: the sampler's "
                    "prefill and decode, the old-policy log-probs, the update; eval: the sampler; self-distill: "
                    "the sampler and the scorer; a recipe: every enabled stage) for a TPU topology with libtpu's "
                    "compile-only devices, from abstract inputs (no weights), and print per program the bytes a "
                    "device holds (arguments + outputs - aliased + temp + code) against its HBM. Exit 0 when "
                    "everything fits, 1 when something does not (each named, with the changes that make it fit: each "
                    "suggested change compiled, the most bytes saved first), 2 on bad input. Override any field with --config.key=value.")
    p.add_argument("--config", required=True, help="configs/FILE.py[:variant]")
    p.add_argument("--topology", required=True,
                   help="TPU accelerator type: v4-8, v5e-8 (= v5litepod-8), v5p-8 ... v5p-256, v6e-8 ... v6e-256; "
                        "a multi-host slice is compiled as the program every host runs; or h100-N (NVIDIA H100s, "
                        "JAX's CUDA plugin installed)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    p.add_argument("--reuse", type=Path, default=None,
                   help="the --json rows of an earlier run for this topology: programs found there (same program "
                        "key) are not compiled again, so a config changed in one stage recompiles only that stage")
    p.add_argument("--no-try-fixes", action="store_true",
                   help="for a program that does not fit, print the changes that might make it fit without compiling "
                        "them (by default each is compiled, and only those that fit are printed, the most bytes "
                        "saved first)")
    p.add_argument("--no-progress", action="store_true", help="no progress line per program")
    p.set_defaults(func=run_plan, accepts_config_overrides=True)


def run_plan(args: argparse.Namespace) -> int:
    import os

    import jax

    from vt.config import load_config
    from vt.plan import topology
    from vt.plan.run import plan

    topology.parse(args.topology)  # an unknown name fails before the config is loaded
    if args.json is not None:
        check_output_path(args.json, "--json")
    raw = load_config(args.config, args.config_overrides)
    # Compiling needs no device: the default backend stays the CPU (on a TPU VM a running job keeps its chips),
    # and libtpu loads beside any other process holding it (its lockfile guards chips this process never opens).
    jax.config.update("jax_platforms", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if args.reuse is not None and not args.reuse.is_file():
        raise VtError(f"--reuse {args.reuse}: no such file (the --json rows of an earlier vt plan run)")
    return plan(raw.to_dict(), args.topology, progress=not args.no_progress, json_out=args.json, reuse=args.reuse,
                fixes=not args.no_try_fixes)
