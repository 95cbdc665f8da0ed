"""The `vt` command: parse flags, call one library function. Thin on purpose.

Each subcommand lives next to the library code it drives and exposes ``register(subparsers)``;
heavy imports (jax, torch) happen inside the handlers so `vt --help` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings

from vt import EXIT_PREEMPTED, Terminated, VtError
from vt.checkpoint.seal import set_verify
from vt.cluster import cpu_only_host, detect
from vt.io import error_detail, out_of_space
from vt.validation import ArgumentParser

# Modules that contribute subcommands, in the order `vt --help` lists them, and the commands each registers:
# `vt <command>` imports only its module (every import here is start-up time of every command: `vt reward` on
# HumanEval records pays it per file scored), `vt`, `vt --help` and an unknown command all of them.
COMMAND_MODULES = {
    "vt.checkpoint.commands": ("convert", "info"),
    "vt.sampling.commands": ("sample",),
    "vt.rewards.commands": ("reward",),
    "vt.learners.commands": ("train",),
    "vt.train.commands": ("merge",),
    "vt.rl.commands": ("profile",),
    "vt.eval.commands": ("eval",),
    "vt.datagen.commands": ("data",),  # data filter|dedup|decontam|expand|judge|distill|stratify
    "vt.data.commands": ("tokenizer",),  # tokenizer build-qwen2.5
    "vt.distill.commands": ("self-distill",),
    "vt.recipe.commands": ("pipeline", "demo"),
    "vt.plan.commands": ("plan",),
}


def build_parser(command: str | None = None) -> ArgumentParser:
    """The parser of every command, or only of ``command``'s module when that registers it."""
    # Subparsers inherit the class: every usage error of every subcommand is one line, exit code 2.
    parser = ArgumentParser(prog="vt", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    selected = [m for m, names in COMMAND_MODULES.items() if command in names]
    for name in selected or COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    if selected and command not in subparsers.choices:  # its module no longer registers it: all of them
        return build_parser()
    _name_leaves(parser)
    return parser


def _name_leaves(parser: ArgumentParser) -> None:
    """Each leaf subcommand records its full name ("vt data filter"), which errors are prefixed with."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for sub in action.choices.values():
            _name_leaves(sub)
    if not subs:
        parser.set_defaults(command_name=parser.prog)


class _NoRaisedTracebacks(logging.Filter):
    """Orbax logs (through absl) the traceback of a writer-thread error that it then raises to its caller, where
    `main` reports it in one line or re-raises it: drop the logged copy. asyncio logs, when they are collected,
    the failed write tasks of a save that failed for want of space, which `main` reports: drop those too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("asyncio"):
            return not (record.exc_info and out_of_space(record.exc_info[1]))
        return not (record.levelno >= logging.ERROR and record.exc_info)


def _closed_loop_callback(exc: BaseException | None) -> bool:
    """tensorstore reporting (through sys.excepthook or sys.unraisablehook) a write that completed after Orbax
    stopped its event loop: what a failed save leaves behind, after the failure itself was raised to the caller."""
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


def _install_hooks() -> None:
    """Drop _closed_loop_callback's reports (logged at debug level), pass on everything else."""
    if getattr(sys.excepthook, "drops_closed_loop_callbacks", False):  # main() called again in this process
        return
    log = logging.getLogger("vt")
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def on_exception(exc_type, exc, tb):
        if _closed_loop_callback(exc):
            log.debug("dropped a late tensorstore callback: %s", exc)
        else:
            excepthook(exc_type, exc, tb)

    def on_unraisable(unraisable):
        if _closed_loop_callback(unraisable.exc_value):
            log.debug("dropped a late tensorstore callback: %s", unraisable.exc_value)
        else:
            unraisablehook(unraisable)
    on_exception.drops_closed_loop_callbacks = True
    sys.excepthook, sys.unraisablehook = on_exception, on_unraisable
    # The same failed save leaves write coroutines Orbax never awaited, which Python reports at exit.
    warnings.filterwarnings("ignore", message=r"coroutine '.*async_serialize_from_host", category=RuntimeWarning)


_NO_RAISED_TRACEBACKS = _NoRaisedTracebacks()


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("absl").addFilter(_NO_RAISED_TRACEBACKS)
    logging.getLogger("asyncio").addFilter(_NO_RAISED_TRACEBACKS)
    _install_hooks()
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words else None)
    try:
        args, extra = parser.parse_known_args(argv)
        # Only config-driven commands accept `--config.key=value` overrides; anything else is a typo.
        if extra and not getattr(args, "accepts_config_overrides", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # a usage error (2, one line already printed) or --help (0), as a return code
        return e.code if isinstance(e.code, int) else 0
    args.config_overrides = extra
    name = args.command_name  # "vt data filter"
    try:
        # Joins a multi-host run when launched as one (explicit env, SLURM, TPU VM). One process needs nothing
        # first: a command that uses no device (vt reward, vt data filter, vt tokenizer, vt info) never imports JAX.
        if cpu_only_host():
            os.environ["JAX_PLATFORMS"] = "cpu"  # before any JAX import; vt's subprocesses inherit it
        if detect()[0] != "single":
            from vt.distributed import initialize
            initialize()
        set_verify(not getattr(args, "trust_checkpoint", False))  # the flag vt.checkpoint.seal.add_trust_flag adds
        return int(args.func(args) or 0)
    except VtError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return e.exit_code
    except Terminated as e:
        # SIGTERM while stopping: exit now. Not through the interpreter's shutdown, which would wait for the
        # writers' threads (the wait the signal cut short); everything sealed is safe against a kill.
        print(f"{name}: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_PREEMPTED)
    except BrokenPipeError:  # `vt info ... | head` closed our stdout: stop quietly (before the OSError clause below)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 0
    except Exception as e:
        # Writers clean up after themselves (atomic output directories, temporary files renamed at the end,
        # checkpoints committed by rename), so a full disk leaves nothing half-written that would be used:
        # one line rather than a writer's traceback.
        if out_of_space(e):
            print(f"{name}: error: out of disk space ({error_detail(e)})", file=sys.stderr)
            return 2
        if isinstance(e, OSError) and e.filename is not None:  # a path the file system refused, named
            print(f"{name}: error: {error_detail(e)}", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
