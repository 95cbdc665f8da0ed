#!/usr/bin/env python3
"""Expand a sweep defined next to a config into named runs, and start each through a launcher.

    python launch/sweep.py --config configs/sft_stage1.py:smoke --workdir runs/lr_sweep --dry-run
    python launch/sweep.py --config configs/sft_stage1.py --workdir /shared/lr_sweep \
        --launcher gpu_slurm -- --nodes 2 --time 24:00:00

The config file defines, beside `get_config(arg)`, a `get_sweep(arg)` (same variant argument) returning either
  a grid:  {"optim.lr": [1e-5, 5e-5], "data.seed": [0, 1]}         every combination (here 4 runs), or
  a list:  [{"optim.lr": 1e-5}, {"name": "long", "optim.lr": 5e-5, "train.steps": 2000}]   one run per entry
with keys in the dotted form of `--config.KEY=VALUE` overrides. Run i is named `rNN-key=value-...` (or `name`)
and runs `vt COMMAND --config SPEC --workdir WORKDIR/NAME --config.KEY=VALUE ...` through the launcher:
  none       directly, one after another (default)
  local      launch/local.sh [LAUNCHER ARGS] -- CMD   (N local processes per run)
  gpu_slurm  launch/gpu_slurm.sh [LAUNCHER ARGS] -- CMD   (one SLURM job per run)
  tpu_pod    launch/tpu_pod.sh [LAUNCHER ARGS] --only run -- CMD   (runs one after another on the slice)
Every run's config is loaded with its overrides before anything starts: an unknown key or a badly typed value
stops the sweep with nothing launched. --dry-run prints every command instead of running it.
"""
from __future__ import annotations

import argparse
import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
LAUNCHERS = {
    "none": [],
    "local": [str(REPO / "launch" / "local.sh")],
    "gpu_slurm": [str(REPO / "launch" / "gpu_slurm.sh")],
    "tpu_pod": [str(REPO / "launch" / "tpu_pod.sh")],
}


class SweepError(Exception):
    pass


def load_sweep(spec: str) -> Any:
    from vt import VtError
    from vt.config import import_config_module
    path_str, _, variant = spec.partition(":")
    try:
        module = import_config_module(Path(path_str))
    except VtError as e:
        raise SweepError(str(e)) from None
    if not hasattr(module, "get_sweep"):
        raise SweepError(f"{path_str}: defines no get_sweep(arg); a sweep lives next to its config")
    return module.get_sweep(variant or None)


def format_value(value: Any) -> str:
    """The VALUE of --config.KEY=VALUE: strings as they are, everything else as a Python literal."""
    return value if isinstance(value, str) else repr(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", text).strip("-")


def expand(sweep: Any) -> list[tuple[str, dict[str, Any]]]:
    """[(run name, {dotted key: value})] for a grid (dict of lists) or a list of dicts."""
    if isinstance(sweep, dict):
        if not sweep:
            raise SweepError("get_sweep returned an empty grid")
        for key, values in sweep.items():
            if not isinstance(values, (list, tuple)) or not values:
                raise SweepError(f"grid key {key!r}: expected a non-empty list of values, got {values!r}")
        keys = list(sweep)
        entries = [dict(zip(keys, combo)) for combo in itertools.product(*(sweep[k] for k in keys))]
    elif isinstance(sweep, (list, tuple)):
        if not sweep or not all(isinstance(e, dict) for e in sweep):
            raise SweepError("get_sweep returned a list: it must be a non-empty list of dicts of overrides")
        entries = [dict(e) for e in sweep]
    else:
        raise SweepError(f"get_sweep must return a dict (grid) or a list of dicts, got {type(sweep).__name__}")
    runs, seen = [], set()
    for i, entry in enumerate(entries):
        name = entry.pop("name", None)
        if name is None:
            parts = [f"{k.rsplit('.', 1)[-1]}={format_value(v)}" for k, v in entry.items()]
            name = f"r{i:02d}" + ("-" + "-".join(parts) if parts else "")
        name = _slug(str(name))
        if not name or name in seen:
            raise SweepError(f"run {i}: name {name!r} is empty or used twice")
        seen.add(name)
        runs.append((name, entry))
    return runs


def overrides(entry: dict[str, Any]) -> list[str]:
    return [f"--config.{k}={format_value(v)}" for k, v in entry.items()]


def validate(spec: str, runs: list[tuple[str, dict[str, Any]]]) -> None:
    """Load every run's config with its overrides (vt.config raises VtError on unknown keys or bad values)."""
    from vt import VtError
    from vt.config import load_config
    for name, entry in runs:
        try:
            load_config(spec, overrides(entry))
        except VtError as e:
            raise SweepError(f"run {name}: {e}") from None


def commands(spec: str, workdir: str, runs, launcher: str, launcher_args: Sequence[str],
             vt_command: str = "train") -> list[tuple[str, list[str]]]:
    out = []
    for name, entry in runs:
        cmd = ["vt", vt_command, "--config", spec, "--workdir", str(Path(workdir) / name), *overrides(entry)]
        if launcher != "none":
            extra = ["--only", "run"] if launcher == "tpu_pod" else []
            cmd = [*LAUNCHERS[launcher], *launcher_args, *extra, "--", *cmd]
        out.append((name, cmd))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, launcher_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="launch/sweep.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--config", required=True, help="configs/FILE.py[:variant] defining get_sweep")
    p.add_argument("--workdir", required=True, help="parent directory: each run gets WORKDIR/RUN_NAME")
    p.add_argument("--launcher", choices=sorted(LAUNCHERS), default="none")
    p.add_argument("--command", default="train", help="vt subcommand each run executes (default: train)")
    p.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    args = p.parse_args(argv)
    try:
        runs = expand(load_sweep(args.config))
        validate(args.config, runs)
    except SweepError as e:
        print(f"launch/sweep.py: error: {e}", file=sys.stderr)
        return 2
    cmds = commands(args.config, args.workdir, runs, args.launcher, launcher_args, args.command)
    print(f"# {len(cmds)} runs from {args.config}", flush=True)
    for name, cmd in cmds:
        print(f"# run {name}\n{shlex.join(cmd)}", flush=True)
        if args.dry_run:
            continue
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print(f"launch/sweep.py: run {name} failed with status {rc}; later runs not started", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
