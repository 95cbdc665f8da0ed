"""vt.cluster and vt.distributed: how initialize() decides to start (explicit, SLURM, TPU VM, single), the NVIDIA settings, and
the persistent compilation cache."""
from __future__ import annotations

import importlib.util
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


def _pci(root, *devices: tuple[str, str]):
    """A fake /sys/bus/pci/devices: one function-0 directory per (vendor, device) ID pair."""
    for i, (vendor, device) in enumerate(devices):
        (root / f"0000:00:0{i}.0").mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device)):
            (root / f"0000:00:0{i}.0" / name).write_text(value + "\n")
    return str(root)


INTEL_NIC, GVNIC, GOOGLE_NVME, TPU_V5P = ("0x8086", "0x10d3"), ("0x1ae0", "0x0042"), ("0x1ae0", "0x001f"), \
    ("0x1ae0", "0x0062")


def test_tpu_vm_detected_from_pci_ids(tmp_path):
    sysfs = _pci(tmp_path / "tpu_vm", INTEL_NIC, GVNIC, TPU_V5P, TPU_V5P)
    assert cluster.detect(env={}, sysfs=sysfs) == ("tpu", {})
    assert cluster.detect(env={"VT_DISTRIBUTED": "off"}, sysfs=sysfs) == ("single", {})
    # Google is also the vendor of GCE VMs' gVNIC (and NVMe disks): a GPU or CPU VM there is no TPU VM
    assert cluster.detect(env={}, sysfs=_pci(tmp_path / "gce_vm", GVNIC, GOOGLE_NVME)) == ("single", {})


def test_tpu_device_ids_are_jaxs():
    from jax._src import hardware_utils

    assert cluster.TPU_PCI_DEVICE_IDS == set(hardware_utils._TPU_PCI_DEVICE_IDS)


def test_cpu_only_host_names_the_cpu_only_where_libtpu_could_only_fail(tmp_path):
    """libtpu installed (this suite's extra), no TPU chip, no GPU device node and no JAX_PLATFORMS: the CPU."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the test extra installs it)")
    nodes = str(tmp_path / "dev" / "nvidia*"), str(tmp_path / "dev" / "kfd")
    plain = _pci(tmp_path / "cpu_box", INTEL_NIC, GVNIC)
    assert cluster.cpu_only_host(env={}, sysfs=plain, dev_nodes=nodes)
    assert not cluster.cpu_only_host(env={"JAX_PLATFORMS": ""}, sysfs=plain, dev_nodes=nodes)  # the user's choice
    assert not cluster.cpu_only_host(env={}, sysfs=_pci(tmp_path / "tpu_vm", TPU_V5P), dev_nodes=nodes)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    assert not cluster.cpu_only_host(env={}, sysfs=plain, dev_nodes=nodes)


def test_a_command_on_a_cpu_box_with_libtpu_prints_no_tpu_noise(vt_ckpt_qwen2, tmp_path):
    """libtpu installed on a host without TPU chips (this suite's extra on a CPU box) and JAX_PLATFORMS unset: a
    command that runs on a device comes up on the CPU without libtpu's failure log on stderr."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the test extra installs it)")
    if not cluster.cpu_only_host(env={}):
        pytest.skip("this host has a TPU chip or a GPU device node")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    command = ["convert", "orbax-to-hf", str(vt_ckpt_qwen2), str(tmp_path / "hf"), "--no-tokenizer"]
    proc = subprocess.run([sys.executable, "-m", "vt", *command], capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "TPU" not in proc.stderr and "libtpu" not in proc.stderr, proc.stderr
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
