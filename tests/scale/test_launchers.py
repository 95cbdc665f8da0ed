"""launch/: --dry-run output (commands, environment, worker counts), shellcheck, and local.sh's process
handling with stand-in commands (no JAX: the real multi-process runs are in test_multiprocess.py)."""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testutil import REPO

LAUNCH = REPO / "launch"
SCRIPTS = ["local.sh", "tpu_pod.sh", "gpu_slurm.sh", "gpu_slurm.sbatch"]


def sh(*args, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS", "SLURM_"))}
    # The venv's python first: gpu_slurm.sbatch asks `python3 -m vt.distributed` for the NVIDIA settings.
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '')}"
    return subprocess.run(["bash", *map(str, args)], cwd=REPO, env={**base, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
def test_shellcheck_clean():
    proc = subprocess.run(["shellcheck", *(str(LAUNCH / s) for s in SCRIPTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scripts_are_executable():
    for name in [*SCRIPTS, "sweep.py"]:
        assert os.access(LAUNCH / name, os.X_OK), name


# --- local.sh ---------------------------------------------------------------------------------------------------

def test_local_dry_run_lists_every_process_with_its_environment():
    proc = sh(LAUNCH / "local.sh", "--dry-run", "-n", 3, "-d", 2, "-p", 4567, "--", "vt", "train", "--workdir", "a b",
              env={"XLA_FLAGS": "--xla_force_host_platform_device_count=9 --xla_dump_to=/tmp/x"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "# launch/local.sh: 3 processes x 2 CPU devices = 6 devices"
    assert len(lines) == 4
    for i, line in enumerate(lines[1:]):
        words = shlex.split(line)
        assert words[0] == "env"
        env = dict(w.split("=", 1) for w in words[1:6])
        assert env == {"JAX_PLATFORMS": "cpu",
                       "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2",
                       "JAX_COORDINATOR_ADDRESS": "127.0.0.1:4567", "JAX_NUM_PROCESSES": "3",
                       "JAX_PROCESS_ID": str(i)}
        assert words[6:] == ["vt", "train", "--workdir", "a b"]


def test_local_runs_every_process_and_collects_logs(tmp_path):
    script = 'echo "process $JAX_PROCESS_ID of $JAX_NUM_PROCESSES at $JAX_COORDINATOR_ADDRESS"'
    proc = sh(LAUNCH / "local.sh", "-n", 3, "-d", 2, "--log-dir", tmp_path, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("process 0 of 3 at 127.0.0.1:")
    for i in (1, 2):
        assert (tmp_path / f"process_{i}.log").read_text().startswith(f"process {i} of 3 at 127.0.0.1:")


def test_local_failure_stops_the_others_and_reports(tmp_path):
    # process 1 fails at once; process 0 would sleep for a minute: it must be stopped, not waited for.
    script = '[ "$JAX_PROCESS_ID" = 1 ] && { echo boom; exit 3; }; sleep 60'
    proc = sh(LAUNCH / "local.sh", "-n", 2, "--log-dir", tmp_path, "--", "sh", "-c", script, timeout=40)
    assert proc.returncode == 3
    assert "process 1 exited with status 3" in proc.stderr and "boom" in proc.stderr


@pytest.mark.parametrize("args", [["--"], ["-n", "0", "--", "true"], ["--bogus", "--", "true"], ["true"]])
def test_local_rejects_bad_arguments(args):
    proc = sh(LAUNCH / "local.sh", *args)
    assert proc.returncode == 2 and "error" in proc.stderr


# --- gpu_slurm ---------------------------------------------------------------------------------------------------

def _nvidia_flags() -> str:
    from vt.distributed import NVIDIA_XLA_FLAGS
    return " ".join(NVIDIA_XLA_FLAGS)


def test_gpu_slurm_dry_run_one_process_per_gpu():
    proc = sh(LAUNCH / "gpu_slurm.sh", "--dry-run", "--nodes", 2, "--gpus-per-node", 8, "--time", "4:00:00",
              "--partition", "h200", "--venv", REPO / ".venv", "--", "vt", "train", "--config", "c.py")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    sbatch = shlex.split(lines[0])
    assert sbatch[0] == "sbatch"
    for flag in ("--nodes=2", "--gpus-per-node=8", "--ntasks-per-node=8", "--time=4:00:00", "--partition=h200"):
        assert flag in sbatch
    assert sbatch[-4:] == ["vt", "train", "--config", "c.py"]
    assert sbatch[-5].endswith("launch/gpu_slurm.sbatch")
    assert "# 2 nodes x 8 processes per node = 16 processes, 1 GPU(s) per process" in lines
    exports = dict(shlex.split(x)[1].split("=", 1) for x in lines if x.startswith("export "))
    assert exports["XLA_FLAGS"] == _nvidia_flags()
    assert exports["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.90"
    assert "JAX_COMPILATION_CACHE_DIR" in exports and "JAX_LOCAL_DEVICE_IDS" not in exports
    srun = shlex.split(lines[-1])
    assert srun[:3] == ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=8"]
    assert srun[3:] == ["vt", "train", "--config", "c.py"]


def test_gpu_slurm_dry_run_one_process_per_host():
    proc = sh(LAUNCH / "gpu_slurm.sh", "--dry-run", "--nodes", 4, "--per", "host", "--venv", REPO / ".venv",
              "--", "vt", "train")
    assert proc.returncode == 0, proc.stderr
    assert "--ntasks-per-node=1" in shlex.split(proc.stdout.splitlines()[0])
    assert "# 4 nodes x 1 processes per node = 4 processes, 8 GPU(s) per process" in proc.stdout
    assert "export JAX_LOCAL_DEVICE_IDS=0\\,1\\,2\\,3\\,4\\,5\\,6\\,7" in proc.stdout


def test_gpu_slurm_sbatch_rejects_a_task_layout_that_does_not_match():
    env = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_NODE": "h200:8",
           "VT_DRY_RUN": "1", "VT_VENV": str(REPO / ".venv")}
    proc = sh(LAUNCH / "gpu_slurm.sbatch", "vt", "train", env=env)
    assert proc.returncode == 2 and "needs --ntasks-per-node=8, got 4" in proc.stderr


def test_nvidia_xla_flags_are_known_to_this_xla():
    """An unknown flag in XLA_FLAGS aborts XLA at start-up; the GPU flags are parsed on every backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_FLAGS")}
    env.update(XLA_FLAGS=_nvidia_flags(), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices()))"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# --- tpu_pod ------------------------------------------------------------------------------------------------------

def test_tpu_pod_dry_run_prints_every_gcloud_command():
    proc = sh(LAUNCH / "tpu_pod.sh", "--dry-run", "--name", "vt-a", "--zone", "us-east5-a", "--type", "v5p-32",
              "--project", "p1", "--spot", "--cache", "gs://b/cache", "--delete", "--",
              "vt", "train", "--config", "configs/sft_stage1.py", "--workdir", "/mnt/shared/run")
    assert proc.returncode == 0, proc.stderr
    cmds = [shlex.split(x) for x in proc.stdout.splitlines() if x.startswith("gcloud")]
    assert [c[4] for c in cmds] == ["create", "scp", "ssh", "ssh", "delete"]
    create, scp, install, run, delete = cmds
    assert create[5] == "vt-a" and "--accelerator-type" in create and "v5p-32" in create and "--spot" in create
    for c in cmds:
        assert c[c.index("--zone") + 1] == "us-east5-a" and c[c.index("--project") + 1] == "p1"
    for c in (scp, install, run):
        assert "--worker=all" in c
    assert '".[tpu]"' in install[install.index("--command") + 1]
    remote = shlex.split(run[run.index("--command") + 1])
    assert "VT_DISTRIBUTED=auto" in remote and "JAX_COMPILATION_CACHE_DIR=gs://b/cache" in remote
    assert remote[-6:] == ["vt", "train", "--config", "configs/sft_stage1.py", "--workdir", "/mnt/shared/run"]


def test_tpu_pod_dry_run_plans_first():
    """`vt plan` for the slice's type comes before create, with the command's config and overrides; --no-plan
    and a command without --config skip it."""
    cmd = ["--dry-run", "--name", "n", "--zone", "z", "--type", "v6e-8", "--", "vt", "train", "--config",
           "configs/sft_stage1.py", "--config.data.seq_len=4096", "--workdir", "/w"]
    lines = sh(LAUNCH / "tpu_pod.sh", *cmd).stdout.splitlines()
    plan = next(i for i, x in enumerate(lines) if " -m vt plan " in x)
    assert shlex.split(lines[plan])[3:] == ["plan", "--config", "configs/sft_stage1.py", "--topology", "v6e-8",
                                            "--config.data.seq_len=4096"]
    assert plan < next(i for i, x in enumerate(lines) if x.startswith("gcloud") and " create " in x)
    assert " -m vt plan " not in sh(LAUNCH / "tpu_pod.sh", "--no-plan", *cmd).stdout
    assert " -m vt plan " not in sh(LAUNCH / "tpu_pod.sh", *cmd[:9], "info", "/w").stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_tpu_pod_stops_before_create_when_the_config_does_not_fit(tmp_path):
    """A config whose decode cannot fit v5p-8 (a KV pool of 123 GB a device) stops the launch with exit 1:
    gcloud is never called."""
    log = tmp_path / "gcloud.log"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(0o755)
    proc = sh(LAUNCH / "tpu_pod.sh", "--name", "n", "--zone", "z", "--type", "v5p-8", "--", "vt", "eval",
              "--config", "configs/eval_aime25.py:smoke", "--config.model.mesh.fsdp=-1",
              "--config.sampling.kv_pages=10000000", env={"PATH": f"{fake.parent}:{os.environ['PATH']}"}, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "eval/decode:" in proc.stdout and "does not fit v5p-8" in proc.stderr
    assert not log.exists()


def test_tpu_pod_without_a_python_that_has_vt_is_an_error_not_a_config_that_does_not_fit(tmp_path):
    """A checkout without its .venv, whose python3 cannot import vt: the plan cannot run, and the launcher says so
    (exit 2) instead of reading python's exit 1 as vt plan's "does not fit"; gcloud is never called."""
    shutil.copytree(LAUNCH, tmp_path / "launch")  # a checkout of the launchers alone: no .venv, no vt package
    log, fake = tmp_path / "gcloud.log", tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "PYTHONPATH": ""}
    proc = sh(tmp_path / "launch" / "tpu_pod.sh", "--name", "n", "--zone", "z", "--type", "v5p-8", "--", "vt", "eval",
              "--config", "configs/eval_aime25.py:smoke", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot import vt" in proc.stderr and "does not fit" not in proc.stderr
    assert not log.exists()


def test_tpu_pod_only_run_and_errors():
    proc = sh(LAUNCH / "tpu_pod.sh", "--dry-run", "--only", "run", "--name", "n", "--zone", "z", "--", "vt", "info")
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("gcloud")]
    assert len(lines) == 1 and "--worker=all" in lines[0] and " ssh " in lines[0]
    assert sh(LAUNCH / "tpu_pod.sh", "--dry-run", "--zone", "z", "--", "vt").returncode == 2  # no --name
    assert sh(LAUNCH / "tpu_pod.sh", "--dry-run", "--name", "n", "--zone", "z").returncode == 2  # no command
    assert sh(LAUNCH / "tpu_pod.sh", "--dry-run", "--name", "n", "--zone", "z", "--only", "x", "--", "vt").returncode == 2
