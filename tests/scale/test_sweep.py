"""launch/sweep.py: grid and list expansion into named runs, commands through launchers, and validation of every
run's overrides before anything starts."""
from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys

import pytest

from testutil import REPO

CONFIG = "tests/scale/sweep_config.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("vt_launch_sweep", REPO / "launch" / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_expands_to_every_combination(sweep):
    runs = sweep.expand(sweep.load_sweep(str(REPO / CONFIG)))
    assert runs == [("r00-lr=1e-05-seed=0", {"optim.lr": 1e-5, "data.seed": 0}),
                    ("r01-lr=1e-05-seed=1", {"optim.lr": 1e-5, "data.seed": 1}),
                    ("r02-lr=3e-05-seed=0", {"optim.lr": 3e-5, "data.seed": 0}),
                    ("r03-lr=3e-05-seed=1", {"optim.lr": 3e-5, "data.seed": 1})]


def test_list_with_names(sweep):
    runs = sweep.expand(sweep.load_sweep(str(REPO / CONFIG) + ":list"))
    assert [name for name, _ in runs] == ["r00-lr=1e-05", "long-warmup"]
    assert sweep.overrides(runs[1][1]) == ["--config.optim.lr=3e-05", "--config.optim.warmup_frac=0.1",
                                           "--config.data.train=other/*.jsonl"]


@pytest.mark.parametrize("bad, message", [
    ({}, "empty grid"), ({"a": []}, "non-empty list"), ([], "non-empty list of dicts"), (3, "got int"),
    ([{"name": "x"}, {"name": "x"}], "used twice"),
])
def test_malformed_sweeps(sweep, bad, message):
    with pytest.raises(sweep.SweepError, match=message):
        sweep.expand(bad)


def run_cli(*args):
    return subprocess.run([sys.executable, "launch/sweep.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_dry_run_prints_every_command():
    proc = run_cli("--config", CONFIG, "--workdir", "runs/grid", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    cmds = [shlex.split(x) for x in proc.stdout.splitlines() if not x.startswith("#")]
    assert len(cmds) == 4
    assert cmds[3] == ["vt", "train", "--config", CONFIG, "--workdir", "runs/grid/r03-lr=3e-05-seed=1",
                       "--config.optim.lr=3e-05", "--config.data.seed=1"]


def test_dry_run_through_launchers():
    proc = run_cli("--config", CONFIG + ":list", "--workdir", "w", "--launcher", "local", "--dry-run", "--", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    cmds = [shlex.split(x) for x in proc.stdout.splitlines() if not x.startswith("#")]
    assert [c[0] for c in cmds] == [str(REPO / "launch" / "local.sh")] * 2
    assert cmds[1][1:6] == ["-n", "2", "--", "vt", "train"]
    assert "--workdir" in cmds[1] and cmds[1][cmds[1].index("--workdir") + 1] == "w/long-warmup"
    proc = run_cli("--config", CONFIG, "--workdir", "w", "--launcher", "tpu_pod", "--dry-run", "--", "--name", "n")
    first = shlex.split([x for x in proc.stdout.splitlines() if not x.startswith("#")][0])
    assert first[1:6] == ["--name", "n", "--only", "run", "--"]


@pytest.mark.parametrize("variant, message", [
    ("bad", "no such field"), ("badtype", "not a valid value for a int field"),
])
def test_bad_override_stops_before_anything_launches(sweep, monkeypatch, variant, message, capsys):
    launched = []
    monkeypatch.setattr(sweep.subprocess, "run", lambda *a, **k: launched.append(a))
    rc = sweep.main(["--config", str(REPO / CONFIG) + ":" + variant, "--workdir", "w", "--launcher", "local"])
    assert rc == 2 and launched == []
    err = capsys.readouterr().err
    assert message in err and "launch/sweep.py: error: run r0" in err


def test_config_without_sweep(sweep):
    with pytest.raises(sweep.SweepError, match="defines no get_sweep"):
        sweep.load_sweep(str(REPO / "configs" / "sft_stage1.py"))
