"""Where a warm worker runs and keeps its files: a CPU of its own (claim_cpu) and the host's tmpfs (scratch_base).

Why: a run's processes wake each other at every step of the run and at every call a test makes to the
solution, and a wake-up on the same CPU costs a fraction of one on another (a pipe round trip between two Python
processes on a 2-core VM: ~8 us on one CPU, ~60 us across two); each sample's solution is written twice (load,
unload), ~0.2 ms a write on a disk file system, ~0.03 ms on tmpfs.
"""
from __future__ import annotations

import fcntl
import os
import stat
import tempfile

HOST_TMPFS = "/dev/shm"
TMPFS_MIN_FREE = 64 << 20


def scratch_base() -> str | None:
    """The host's tmpfs when it is a writable directory with room to spare, else None (the default
    temporary directory). The pool's code directories hold only the server and one solution each."""
    try:
        st = os.statvfs(HOST_TMPFS)
    except OSError:
        return None
    if os.access(HOST_TMPFS, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= TMPFS_MIN_FREE:
        return HOST_TMPFS
    return None


def claim_cpu(directory: str | None = None) -> tuple[int, int] | None:
    """(cpu, lock fd): a CPU of this process's affinity that no other worker holds, in this process or any
    other of this user's (one lock file per CPU, flock'ed while the worker lives: several trainer processes
    on one host spread their workers over the CPUs rather than stacking them on the same ones). None
    when every CPU is taken or the lock directory is not ours: the worker then runs where the scheduler
    puts it. Highest CPUs first: CPU 0 is where a host's interrupts and main threads tend to land."""
    directory = directory or os.path.join(scratch_base() or tempfile.gettempdir(), f"vt-cpus-{os.getuid()}")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError:
        return None
    # A shared, sticky directory: someone else's file or link under our name must not be followed.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for cpu in sorted(os.sched_getaffinity(0), reverse=True):
        try:
            fd = os.open(os.path.join(directory, str(cpu)), flags, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # per open file: two workers of one process conflict too
            return cpu, fd
        except OSError:
            os.close(fd)
    return None


def _started_on(cpu: int | None, start):
    """``start()`` (a Popen) with this thread pinned to ``cpu``: the processes it forks inherit the
    affinity, the thread gets its own back."""
    if cpu is None:
        return start()
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        return start()
    finally:
        os.sched_setaffinity(0, allowed)
