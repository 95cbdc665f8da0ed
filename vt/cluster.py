"""How the processes of a run find each other, decided from the arguments and the environment alone: no JAX,
so the `vt` command asks before any import (`vt.distributed.initialize` connects them; its docstring has the
order of the methods). A command on one process never imports JAX for this."""
from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path
from typing import Mapping

from vt import VtError

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # read by jax.distributed itself as well
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_SWITCH = "VT_DISTRIBUTED"  # "off": never auto-detect SLURM / TPU
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on a Cloud TPU VM are PCI devices of this vendor
# ... and so is the gVNIC network card of GCE VMs (device 0x0042), so a chip is told by its device ID: JAX's own
# list (jax._src.hardware_utils._TPU_PCI_DEVICE_IDS, which tests/scale/test_distributed.py keeps this in step with).
TPU_PCI_DEVICE_IDS = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076", "0x0083",
                                "0x007c"})
_GPU_DEVICE_NODES = ("/dev/nvidia*", "/dev/kfd", "/dev/dxg")  # NVIDIA's driver, AMD's (ROCm), WSL2's


def detect(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
           env: Mapping[str, str] | None = None, sysfs: str = "/sys/bus/pci/devices") -> tuple[str, dict]:
    """Decide how to start (no side effects): (method, keyword arguments for jax.distributed.initialize)."""
    env = os.environ if env is None else env
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    num = num_processes if num_processes is not None else _int_env(env, ENV_NUM_PROCESSES)
    pid = process_id if process_id is not None else _int_env(env, ENV_PROCESS_ID)
    given = {"coordinator": coordinator, "num_processes": num, "process_id": pid}
    if any(v is not None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        if missing:
            raise VtError(f"distributed: {', '.join(missing)} not set; an explicit multi-process start needs the "
                          f"coordinator address, the process count and this process's id "
                          f"({ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})")
        if num < 1 or not 0 <= pid < num:
            raise VtError(f"distributed: process_id={pid} must be in [0, num_processes={num})")
        if ":" not in coordinator:
            raise VtError(f"distributed: coordinator {coordinator!r} must be host:port")
        return "explicit", dict(coordinator_address=coordinator, num_processes=num, process_id=pid)
    switch = env.get(ENV_SWITCH, "").strip().lower()
    if switch not in ("", "auto", "off"):
        raise VtError(f"distributed: {ENV_SWITCH}={env[ENV_SWITCH]!r}; expected 'auto' or 'off'")
    if switch == "off":
        return "single", {}
    if all(v in env for v in _SLURM_VARS):
        return "slurm", dict(cluster_detection_method="slurm")
    if _tpu_chips(sysfs):
        return "tpu", {}  # jax tries each known cluster; on a TPU VM that is the metadata server's answer
    return "single", {}


def _int_env(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise VtError(f"distributed: {key}={raw!r} is not an integer") from None


def _tpu_chips(sysfs: str) -> int:
    count = 0
    for function in glob.glob(os.path.join(sysfs, "*.0")):  # function 0 of each PCI device, as JAX counts chips
        try:
            ids = [(Path(function) / name).read_text().strip() for name in ("vendor", "device")]
        except OSError:
            continue
        count += ids[0] == _GOOGLE_PCI_VENDOR and ids[1] in TPU_PCI_DEVICE_IDS
    return count


def cpu_only_host(env: Mapping[str, str] | None = None, sysfs: str = "/sys/bus/pci/devices",
                  dev_nodes: tuple[str, ...] = _GPU_DEVICE_NODES) -> bool:
    """True when JAX should be told to use the CPU: JAX_PLATFORMS unset, libtpu installed, and this host has neither
    a TPU chip nor a GPU device node. libtpu on such a host is there for `vt plan`'s compile-only TPU devices (the
    test extra installs it); left to choose, JAX starts it for running as well, and libtpu prints its failure (five
    lines of C++ log about host bounds and worker hostnames) in every command. The CPU is then the only backend that
    can come up, so naming it changes nothing else. A TPU chip, a GPU or an explicit JAX_PLATFORMS leave JAX's
    own choice."""
    env = os.environ if env is None else env
    if "JAX_PLATFORMS" in env or _tpu_chips(sysfs) or any(glob.glob(p) for p in dev_nodes):
        return False
    return importlib.util.find_spec("libtpu") is not None
