"""vt.cluster and vt.distributed: how initialize() decides to start (explicit, SLURM, TPU VM, single), the NVIDIA settings, and
the persistent compilation cache."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import vt.cluster as cluster
import vt.distributed as dist
from testutil import REPO
from vt import VtError

SLURM = {"SLURM_JOB_ID": "17", "SLURM_STEP_NODELIST": "gpu[001-002]", "SLURM_NTASKS": "16", "SLURM_PROCID": "3",
         "SLURM_LOCALID": "3"}


def test_explicit_from_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2", **SLURM}
    method, kwargs = cluster.detect(env=env, sysfs="/nonexistent")
    assert method == "explicit"  # explicit settings win over SLURM's
    assert kwargs == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 2}


def test_explicit_arguments_beat_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2"}
    _, kwargs = cluster.detect("h:1", 2, 1, env=env, sysfs="/nonexistent")
    assert kwargs == {"coordinator_address": "h:1", "num_processes": 2, "process_id": 1}


@pytest.mark.parametrize("env, message", [
    ({"JAX_COORDINATOR_ADDRESS": "h:1"}, "num_processes, process_id not set"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "coordinator not set"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "must be in [0, num_processes=2)"),
    ({"JAX_COORDINATOR_ADDRESS": "h", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "must be host:port"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "not an integer"),
    ({"VT_DISTRIBUTED": "maybe"}, "expected 'auto' or 'off'"),
])
def test_partial_or_bad_settings_are_errors(env, message):
    with pytest.raises(VtError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        cluster.detect(env=env, sysfs="/nonexistent")


def test_slurm_step_uses_jax_slurm_detection():
    assert cluster.detect(env=SLURM, sysfs="/nonexistent") == ("slurm", {"cluster_detection_method": "slurm"})
    # the batch script itself (no srun step: no SLURM_STEP_NODELIST) is a single process
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    assert cluster.detect(env=batch, sysfs="/nonexistent") == ("single", {})
    assert cluster.detect(env={**SLURM, "VT_DISTRIBUTED": "off"}, sysfs="/nonexistent") == ("single", {})


def test_tpu_vm_detected_from_pci_vendor(tmp_path):
    for i, vendor in enumerate(["0x8086", "0x1ae0", "0x1ae0"]):
        (tmp_path / f"0000:00:0{i}.0").mkdir()
        (tmp_path / f"0000:00:0{i}.0" / "vendor").write_text(vendor + "\n")
    assert cluster.detect(env={}, sysfs=str(tmp_path)) == ("tpu", {})
    assert cluster.detect(env={"VT_DISTRIBUTED": "off"}, sysfs=str(tmp_path)) == ("single", {})
    assert cluster.detect(env={}, sysfs=str(tmp_path / "none")) == ("single", {})


def test_single_process_initialize(monkeypatch):
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", *SLURM):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(dist, "_INFO", None)
    monkeypatch.setattr(cluster, "_tpu_chips", lambda sysfs: 0)
    info = dist.initialize()
    assert info == dist.DistributedInfo("single", 0, 1) and dist.initialize() is info
    assert dist.is_primary() and dist.process_count() == 1
    dist.barrier("no-op with one process")


def test_nvidia_env_keeps_user_settings():
    env = dist.nvidia_env({"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_dump_to=/d",
                           "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    flags = env["XLA_FLAGS"].split()
    assert "--xla_gpu_enable_triton_gemm=true" in flags and "--xla_gpu_enable_triton_gemm=false" not in flags
    assert "--xla_dump_to=/d" in flags and "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert dist.nvidia_env({})["XLA_FLAGS"] == " ".join(dist.NVIDIA_XLA_FLAGS)


def test_module_cli_prints_exports():
    proc = subprocess.run([sys.executable, "-m", "vt.distributed", "nvidia-env"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("export XLA_FLAGS=") and "XLA_PYTHON_CLIENT_MEM_FRACTION=0.90" in proc.stdout


def test_compilation_cache_writes_entries(tmp_path):
    code = f"""
        import jax, jax.numpy as jnp
        from vt.distributed import enable_compilation_cache
        enable_compilation_cache({str(tmp_path / 'cache')!r}, min_compile_time_s=0)
        jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((32, 32))).block_until_ready()
    """
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JAX_")}, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any((tmp_path / "cache").iterdir())
