"""The `vt` command: parse flags, call one library function. Thin on purpose.

Each subcommand lives next to the library code it drives and exposes ``register(subparsers)``;
heavy imports (jax, torch) happen inside the handlers so `vt --help` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from vt import VtError

# Modules that contribute subcommands, in the order `vt --help` lists them.
COMMAND_MODULES = (
    "vt.checkpoint.commands",  # convert, info
    "vt.sampling.commands",  # sample
    "vt.rewards.commands",  # reward
    "vt.train.commands",  # train, merge
    "vt.rl.commands",  # profile
    "vt.eval.commands",  # eval
    "vt.datagen.commands",  # data filter|dedup|decontam|expand|judge|distill|stratify
    "vt.data.commands",  # tokenizer build-qwen2.5
    "vt.distill.commands",  # self-distill
    "vt.pipeline_commands",  # pipeline, demo
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vt", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that part of vt is not built yet
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Only config-driven commands accept `--config.key=value` overrides; anything else is a typo.
    if extra and not getattr(args, "accepts_config_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.config_overrides = extra
    try:
        # Joins a multi-host run when launched as one (explicit env, SLURM, TPU VM); a no-op otherwise.
        from vt.distributed import initialize
        initialize()
        return int(args.func(args) or 0)
    except VtError as e:
        print(f"vt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `vt info ... | head`
        return 0
    except KeyboardInterrupt:
        print(f"vt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
