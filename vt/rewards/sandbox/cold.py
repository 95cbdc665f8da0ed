"""Run an untrusted Python program in an isolated, bounded process tree, and read its output safely.

Isolation (bubblewrap, https://github.com/containers/bubblewrap), per run:
  - new user, PID, network, IPC, UTS and cgroup namespaces (``--unshare-all``): no network at all (the
    sandbox's loopback is its own and down), and when the PID namespace's init dies the kernel kills
    every process in it, so daemons (``setsid`` + double fork) cannot outlive the run;
  - ``--die-with-parent``: killing the outer bwrap process kills the namespace;
  - a fresh root: read-only /usr (and the /bin, /lib* links), a handful of /etc files, a new /proc, a
    read-only /dev holding only the standard device nodes plus a small size-capped /dev/shm (POSIX
    semaphores), the solution read-only at /code, and a private size-capped tmpfs as /tmp, the root
    itself remounted read-only. /root, /home, /work, the host's /tmp are not there;
  - a clean environment (bwrap itself is started with one, so not even the sandbox's init process
    carries host variables a program could read through /proc/1/environ);
  - when the host runs as root, bwrap is started under a dedicated unprivileged uid per concurrent
    slot: no capabilities anywhere, and RLIMIT_NPROC actually applies (the kernel exempts uid 0 from it,
    so a root-owned fork bomb would be unbounded);
  - one memory budget for the whole run (``Limits.memory_bytes``), every process of it together, the
    pages of its /tmp and /dev/shm included: a memory cgroup per run (cgroup v2, or the v1 memory
    controller) when this host lets us create one (root, or a delegated v2 subtree). Without one, the
    address-space limit is split: at most ``FALLBACK_PROCS`` processes, each with RLIMIT_AS of
    memory_bytes / (FALLBACK_PROCS - 2) (the two bwrap processes count against RLIMIT_NPROC but not
    against the budget), so all of them together still stay within memory_bytes (+ /tmp + /dev/shm);
  - that cgroup is also one group for the CPU scheduler, where the host has the cpu controller: a run's
    processes share one fair share of a CPU however many sessions they make, so a run cannot starve the
    concurrent runs of other samples into timeouts (the scheduler is otherwise fair per session);
  - rlimits set by the harness before any solution code runs (CPU, address space, file size, open
    files, processes);
  - a seccomp filter (``--seccomp``) that refuses the kernel keyring calls (add_key, request_key,
    keyctl: EPERM), as Docker's default profile does: a uid's keyrings belong to its user namespace, not
    to a process, so in a warm sandbox one run could leave data there for the next sample's run;
  - output is read by the host incrementally and the run is killed at ``output_bytes + 1``: a 200 MB
    print costs the grader at most the cap.

The code reward's default is the warm pool (warm.py): the same bwrap arguments, layout, uid and limits,
but one sandbox per worker slot (its memory cgroup shared with a small server that forks each run), not
one per run.

Without bubblewrap (or where it cannot create namespaces) the code reward refuses to run unless
``allow_unsandboxed=True``, which runs the harness as a plain subprocess with only rlimits and a
process group: no file-system, network or daemon isolation. It warns loudly.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import platform
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

log = logging.getLogger(__name__)

# The in-sandbox scripts (inside/), copied into each sandbox's /code under the names the sandbox knows them by.
HARNESS_SOURCE = Path(__file__).parent / "inside" / "harness.py"
STDERR_KEEP = 8192  # trailing stderr bytes kept for classification and details
# Unprivileged uids for sandboxes when the host is root; far above any distribution's range.
_UID_BASE = 1_000_000
_uid_lock = threading.Lock()
_uid_next = _UID_BASE + (os.getpid() % 50_000) * 256
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"  # util-linux: drops to a sandbox uid after the cgroup join
# Without a memory cgroup: processes (and threads) per run, the two bwrap processes included.
FALLBACK_PROCS = 8


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 6.0  # wall-clock per run, start-up included; the whole namespace is killed beyond it
    memory_bytes: int = 2 << 30  # the whole run, all its processes together (see the module docstring)
    output_bytes: int = 16 << 20  # stdout cap; the run is killed at cap + 1 bytes
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE: largest file the program may write
    nproc: int = 64  # RLIMIT_NPROC: processes + threads of the sandbox's uid
    nofile: int = 256  # RLIMIT_NOFILE
    tmp_bytes: int = 64 << 20  # size of the sandbox's private /tmp (tmpfs): bounds all writes together
    shm_bytes: int = 8 << 20  # size of its /dev/shm (tmpfs): multiprocessing's semaphores, not bulk data

    def harness_json(self, with_nproc: bool, memory_cgroup: bool, standing: int = 0) -> str:
        """``standing``: processes of the sandbox's uid that are not the run's and hold no part of its budget
        (the warm pool's server, its parent, its tester and the run's init: warm.STANDING_PROCS)."""
        as_bytes, nproc = self.memory_bytes, self.nproc
        if not memory_cgroup and with_nproc:
            # No cgroup to bound the sum: bound it by (process count) x (address space per process).
            nproc = min(nproc, FALLBACK_PROCS)
            as_bytes = self.memory_bytes // (nproc - 2)
            nproc += standing
        # CPU soft limit just above the wall limit: SIGXCPU (a timeout) if a busy loop somehow outlived it.
        return json.dumps(
            {
                "cpu_s": int(self.wall_s) + 2,
                "as_bytes": as_bytes,
                "fsize_bytes": self.file_bytes,
                "nproc": nproc if with_nproc else None,
                "nofile": self.nofile,
            }
        )


@dataclasses.dataclass(frozen=True)
class RunResult:
    status: str  # "exited" | "timeout" | "output_limit" | "sandbox_error"
    returncode: int | None  # as seen through bwrap: 128 + signal for a signal death
    stdout: bytes
    stderr_tail: bytes
    wall_s: float
    oom_killed: bool = False  # the kernel's OOM killer killed a process of the run (its memory cgroup was full)

    @property
    def signal(self) -> int | None:
        rc = self.returncode
        if rc is None:
            return None
        if rc < 0:
            return -rc
        return rc - 128 if rc > 128 else None


class SandboxUnavailable(RuntimeError):
    pass


class SandboxCgroups:
    """Creates one cgroup per sandbox (a memory budget, and a CPU group) under this process's own cgroup,
    where the host allows it.

    cgroup v2: this process's cgroup in the unified hierarchy, when its ``memory`` controller can be
    enabled for children. Else cgroup v1: this process's cgroup in the hierarchy that carries the
    ``memory`` controller (hosts that still mount v1 for memory, e.g. this project's CI). ``base`` is
    None when neither can be written (not root, no delegation): the caller falls back to rlimits.

    Each such cgroup is also a group of its own for the CPU scheduler where the host has the ``cpu``
    controller (v2: enabled beside ``memory``; v1: a cgroup of the same name in the ``cpu`` hierarchy,
    ``cpu_base``): all processes of a sandbox share one fair share of a CPU, however many sessions they
    make. Without it, the scheduler is fair per session (autogroup): a run that starts thirty spinning
    processes, each in a session of its own, takes all but a thirtieth of every CPU from the concurrent
    runs of other samples, and turns their correct solutions into timeouts.
    """

    def __init__(self):
        self.base, self.version = _memory_cgroup_base()
        self.cpu_base = _cpu_cgroup_base(self.base, self.version)
        for base in (self.base, self.cpu_base):
            remove_stale_cgroups(base)
        # Whether each cgroup made here is also a CPU group (v1: its twin under cpu_base).
        self.cpu_grouped = self.cpu_base is not None or (
            self.version == 2 and "cpu" in _read_words(self.base / "cgroup.subtree_control"))
        self._count = 0
        self._lock = threading.Lock()

    def create(self, limit_bytes: int) -> Path:
        """A new empty cgroup limited to ``limit_bytes`` (no swap; v2: the whole group dies on OOM)."""
        with self._lock:
            self._count += 1
            path = self.base / f"vt-sandbox-{os.getpid()}-{self._count}"
        path.mkdir()
        try:
            if self.version == 2:
                _write(path / "memory.max", limit_bytes)
                _write(path / "memory.swap.max", 0, optional=True)
                _write(path / "memory.oom.group", 1, optional=True)  # no half-killed process trees
            else:
                _write(path / "memory.limit_in_bytes", limit_bytes)
                _write(path / "memory.memsw.limit_in_bytes", limit_bytes, optional=True)
            if self.cpu_base is not None:
                (self.cpu_base / path.name).mkdir()
        except OSError:
            path.rmdir()
            raise
        return path

    def procs(self, path: Path) -> list[str]:
        """The cgroup.procs files a process writes its pid to to join the cgroup ``path`` (and its cpu twin)."""
        files = [str(path / "cgroup.procs")]
        if self.cpu_base is not None:
            files.append(str(self.cpu_base / path.name / "cgroup.procs"))
        return files

    def oom_kills(self, path: Path) -> int:
        """How many processes the OOM killer has killed in this cgroup so far (0 if the kernel does not say)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:  # no pathlib: the warm pool reads this once per run on the host's scoring threads
            with open(f"{path}/{name}", "rb") as f:
                text = f.read()
            for line in text.splitlines():
                key, _, value = line.partition(b" ")
                if key == b"oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self, path: Path) -> None:
        """rmdir once the run's processes are gone (the kernel may still be tearing the last one down)."""
        _remove_cgroup(path)
        if self.cpu_base is not None:
            _remove_cgroup(self.cpu_base / path.name)


_OURS = re.compile(r"vt-sandbox-(?:probe-)?(\d+)(?:-\d+)?")
STALE_AFTER_S = 600.0


def remove_stale_cgroups(base: Path | None) -> None:
    """Remove the cgroups that processes of this host left when they died without closing their rewards
    (SIGKILL, preemption, OOM): an empty memory cgroup still holds kernel memory, and a cluster's nodes
    gather them run after run. Only cgroups whose maker is dead here and that were made at least
    STALE_AFTER_S ago (another PID namespace's maker may be invisible to us, and may be between making one
    and joining it); rmdir itself refuses any cgroup that has a process or a child."""
    if base is None:
        return
    try:
        names = os.listdir(base)
    except OSError:
        return
    now = time.time()
    for name in names:
        m = _OURS.fullmatch(name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            if now - os.stat(base / name).st_mtime >= STALE_AFTER_S:
                os.rmdir(base / name)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        pass
    return True


def _remove_cgroup(path: Path) -> None:
    end = time.monotonic() + 5.0
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > end:
                log.warning("could not remove sandbox cgroup %s", path)
                return
            time.sleep(0.005)


def _write(path: Path, value, optional: bool = False) -> None:
    """Write a cgroup control file; ``optional`` ones (swap accounting, oom.group) may be absent."""
    try:
        path.write_text(f"{value}\n")
    except OSError:  # absent (no swap accounting), refused or EINVAL: the limit that matters is not optional
        if not optional:
            raise


def _own_cgroups(controller: str) -> list[tuple[int, Path]]:
    """(version, directory) of this process's own cgroup in each mounted hierarchy that can carry
    ``controller``: the unified one (v2; whether the controller is enabled there is the caller's
    question) and the v1 hierarchy that has it."""
    try:
        own = {}  # controller ("" for v2) -> path, from /proc/self/cgroup
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                own[c] = path
        mounts = []  # (fstype, super options, root, mount point), from /proc/self/mountinfo
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, right = line.split(" - ", 1)
            fields, rfields = left.split(), right.split()
            mounts.append((rfields[0], rfields[2].split(","), fields[3], fields[4]))
    except (OSError, ValueError, IndexError):
        return []
    found = []
    for fstype, opts, root, point in mounts:
        if fstype == "cgroup2" and "" in own:
            version, own_path = 2, own[""]
        elif fstype == "cgroup" and controller in opts and controller in own:
            version, own_path = 1, own[controller]
        else:
            continue
        rel = own_path[len(root):] if own_path.startswith(root) else own_path
        found.append((version, Path(point) / rel.lstrip("/")))
    return sorted(found, key=lambda vb: -vb[0])  # v2 first


def _memory_cgroup_base() -> tuple[Path | None, int]:
    """(this process's cgroup directory under which per-run memory cgroups can be made, 2 or 1)."""
    for version, base in _own_cgroups("memory"):
        if _usable(base, version):
            return base, version
    return None, 0


def _cpu_cgroup_base(memory_base: Path | None, version: int) -> Path | None:
    """Where the per-run cgroups' cpu twins go (v1), None otherwise. In v2 the cpu controller is enabled
    for the memory cgroups' parent when the host has it (best effort: a cgroup then is a CPU group too)."""
    if memory_base is None:
        return None
    if version == 2:
        if "cpu" in _read_words(memory_base / "cgroup.controllers"):
            _write(memory_base / "cgroup.subtree_control", "+cpu", optional=True)
        return None
    for v, base in _own_cgroups("cpu"):
        if v == 1:
            probe = base / f"vt-sandbox-probe-{os.getpid()}"
            try:
                probe.mkdir()
                probe.rmdir()
                return base
            except OSError:
                return None
    return None


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _usable(base: Path, version: int) -> bool:
    """Whether a child memory cgroup with a limit can be made here: try one."""
    try:
        if version == 2:
            if "memory" not in (base / "cgroup.controllers").read_text().split():
                return False
            if "memory" not in (base / "cgroup.subtree_control").read_text().split():
                _write(base / "cgroup.subtree_control", "+memory")  # fails if processes sit in base itself
        probe = base / f"vt-sandbox-probe-{os.getpid()}"
        probe.mkdir()
        try:
            _write(probe / ("memory.max" if version == 2 else "memory.limit_in_bytes"), 64 << 20)
        finally:
            probe.rmdir()
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=None)
def sandbox_cgroups() -> SandboxCgroups:
    """One per process: which hierarchy to use is a property of the host, probed once."""
    return SandboxCgroups()


def _launcher(procs: list[str], uid: int | None) -> tuple[list[str], dict]:
    """(argv prefix, Popen arguments) that start a command in the cgroups whose ``cgroup.procs`` files are
    ``procs`` (one or two: memory, cpu) as ``uid``, with no Python code between fork and exec: a
    ``preexec_fn`` would run the host's fork handlers in a child of a process that has JAX's threads (JAX
    warns that this may deadlock). The cgroups are joined by a shell as root (every later process of the
    run is born inside them), then setpriv drops to ``uid`` and execs the command, all in one process (one
    pid: the command's)."""
    if not procs:
        return [], ({"user": uid, "group": uid, "extra_groups": []} if uid is not None else {})
    drop = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
    join = 'echo 0 > "$0" && { [ "$1" = - ] || echo 0 > "$1"; } && shift && exec "$@"'
    return ["/bin/sh", "-c", join, procs[0], procs[1] if len(procs) > 1 else "-", *drop], {}


def allocate_uids(n: int) -> list[int]:
    global _uid_next
    with _uid_lock:
        uids = list(range(_uid_next, _uid_next + n))
        _uid_next += n
    return uids


def default_python() -> str:
    """The interpreter for untrusted code: the system one, so nothing of the trainer's venv is exposed."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK):
            return p
    return os.path.realpath(sys.executable)


def _root_layout(python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", f, f]
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        args += ["--ro-bind", prefix, prefix]  # e.g. a pyenv interpreter outside /usr
    return args


class Sandbox:
    """Runs ``solution.py`` through the harness (inside/harness.py, /code/_harness.py in the sandbox) in a bwrap
    sandbox (or, if allowed, without one)."""

    def __init__(self, python: str | None = None, allow_unsandboxed: bool = False, slots: int = 1,
                 memory_cgroup: bool = True):
        """memory_cgroup=False: use the rlimit fallback even where cgroups work (tests of the fallback)."""
        self.python = python or default_python()
        self.cgroups = sandbox_cgroups() if memory_cgroup else None
        if self.cgroups is not None and self.cgroups.base is None:
            self.cgroups = None
        self.bwrap = shutil.which("bwrap")
        self.is_root = os.geteuid() == 0
        self.uids = allocate_uids(slots) if self.is_root else []
        problem = probe(self.bwrap, self.python, self.uids[0] if self.uids else None)
        self.isolated = problem is None
        if not self.isolated:
            if not allow_unsandboxed:
                raise SandboxUnavailable(
                    f"code sandbox unavailable ({problem}); install bubblewrap (apt-get install bubblewrap) "
                    "and allow user namespaces, or pass allow_unsandboxed=True to run untrusted code WITHOUT "
                    "file-system, network or daemon isolation"
                )
            msg = (
                f"!!! vt code reward: NO SANDBOX ({problem}). Untrusted programs run as plain subprocesses "
                "with only rlimits: they can read your files, reach the network and leave daemons behind. !!!"
            )
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning(msg)

    def run(self, code_dir: Path, mode: str, stdin: bytes, limits: Limits, uid: int | None) -> RunResult:
        """One program run. ``code_dir`` holds solution.py and _harness.py (see prepare_code_dir)."""
        with tempfile.TemporaryFile() as stdin_f:  # anonymous: only the host can open it
            stdin_f.write(stdin)
            stdin_f.seek(0)
            if self.isolated:
                return self._run(code_dir, None, mode, stdin_f, limits, uid)
            work = Path(tempfile.mkdtemp(prefix="run-", dir=code_dir.parent))
            try:
                return self._run(code_dir, work, mode, stdin_f, limits, uid)
            finally:
                force_rmtree(work)

    def _run(self, code_dir: Path, work: Path | None, mode: str, stdin_f, limits: Limits, uid: int | None) -> RunResult:
        cgroup = self.cgroups.create(limits.memory_bytes) if self.cgroups is not None else None
        limits_json = limits.harness_json(with_nproc=self.isolated, memory_cgroup=cgroup is not None)
        info_r, info_w = os.pipe()
        out_r, out_w = os.pipe()
        seccomp = seccomp_fd() if self.isolated else None
        # The run's stdin and stdout reach the harness on fds of their own (see channel_fds), never as the
        # stdio of bwrap, whose init would hold them for the whole run.
        channels = (stdin_f.fileno(), out_w)
        try:
            if self.isolated:
                argv = bwrap_argv(self.bwrap, self.python, code_dir, limits.tmp_bytes, info_w, limits.shm_bytes,
                                  seccomp)
                argv += [self.python, "-I", "/code/_harness.py", limits_json, mode, channel_arg(channels)]
                cwd = "/"
            else:  # allow_unsandboxed: a plain process in a scratch directory
                argv = [self.python, "-I", str(code_dir / "_harness.py"), limits_json, mode, channel_arg(channels)]
                cwd = str(work)
                if uid is not None:
                    os.chown(work, uid, uid)
            prefix, ids = _launcher(self.cgroups.procs(cgroup) if cgroup is not None else [], uid)
            start = time.monotonic()
            proc = subprocess.Popen(
                prefix + argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_clean_env(),
                cwd=cwd,
                start_new_session=True,
                pass_fds=launch_fds(info_w, seccomp, *channels) if self.isolated else channels,
                close_fds=True,
                **ids,
            )
            os.close(info_w)
            info_w = -1
            os.close(out_w)
            out_w = -1
            status, out, err, started = _pump(
                proc, out_r, start + limits.wall_s, limits.output_bytes, info_r if self.isolated else None
            )
            wall = time.monotonic() - start
            oom = cgroup is not None and self.cgroups.oom_kills(cgroup) > 0
        finally:
            for fd in (info_w, out_w, seccomp):
                if fd is not None and fd >= 0:
                    os.close(fd)
            os.close(info_r)
            os.close(out_r)
            if cgroup is not None:
                self.cgroups.remove(cgroup)
        if status == "exited" and not started:
            status = "sandbox_error"
        return RunResult(status, proc.returncode, out, err, wall, oom)


def channel_arg(fds: tuple[int, ...]) -> str:
    """The argument that tells the harness (or the pool's server) which inherited fds are its channels.

    bwrap's own stdin and stdout are /dev/null: its init (the sandbox's PID 1) keeps the stdio it was
    started with for the whole run, and a program of the same uid (vt running as an ordinary user) may
    open /proc/1/fd/N. The channels are passed as extra fds instead, which the init closes at once
    (bubblewrap closes every fd but stdio in PID 1) and the harness moves onto its stdin and stdout."""
    return ",".join(str(fd) for fd in fds)


# The seccomp filter (classic BPF over struct seccomp_data: nr at offset 0, arch at 4), per architecture:
# AUDIT_ARCH value and the numbers of add_key, request_key, keyctl. Another architecture's calls (i386's
# int 0x80 on x86_64) and x32's numbers (bit 30) are refused whole. Unknown machines run without it.
_KEYRING_CALLS = {
    "x86_64": (0xC000003E, (248, 249, 250)),
    "aarch64": (0xC00000B7, (217, 218, 219)),
}
_BPF_LD_ABS_W, _BPF_JEQ, _BPF_JGE, _BPF_RET = 0x20, 0x15, 0x35, 0x06
_SECCOMP_ALLOW, _SECCOMP_EPERM = 0x7FFF0000, 0x00050000 | 1


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes | None:
    """The filter bwrap's ``--seccomp`` loads, as struct sock_filter[] (u16 code, u8 jt, u8 jf, u32 k)."""
    arch = _KEYRING_CALLS.get(platform.machine())
    if arch is None:
        return None
    audit_arch, (add_key, request_key, keyctl) = arch
    deny = 8  # the index of the last instruction; a jump's offset counts from the next one
    program = [
        (_BPF_LD_ABS_W, 0, 0, 4),  # 0: the architecture
        (_BPF_JEQ, 0, deny - 2, audit_arch),  # 1: another one's call: refused
        (_BPF_LD_ABS_W, 0, 0, 0),  # 2: the call's number
        (_BPF_JGE, deny - 4, 0, 0x40000000),  # 3: x32
        (_BPF_JEQ, deny - 5, 0, add_key),  # 4
        (_BPF_JEQ, deny - 6, 0, request_key),  # 5
        (_BPF_JEQ, deny - 7, 0, keyctl),  # 6
        (_BPF_RET, 0, 0, _SECCOMP_ALLOW),  # 7
        (_BPF_RET, 0, 0, _SECCOMP_EPERM),  # 8: deny
    ]
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def seccomp_fd() -> int | None:
    """A fresh fd holding the filter, for one bwrap to read (one per launch: a shared fd shares its offset)."""
    program = seccomp_program()
    if program is None:
        return None
    fd = os.memfd_create("vt-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def launch_fds(info_fd: int, seccomp: int | None, *channels: int) -> tuple[int, ...]:
    """The fds a bwrap launch inherits: its info fd, the seccomp filter's where there is one, and the run's
    channels (see channel_arg)."""
    return (info_fd, *channels) if seccomp is None else (info_fd, seccomp, *channels)


# Host-wide counters a run can move and a later (or concurrent) run could read back: CPU ticks and the
# count of forks since boot (stat), page faults (vmstat), load, idle time, memory, dentries and inodes
# (sys/fs), pressure stall times, interrupts, disk I/O, file locks, key and cgroup counts. Hidden in a cold
# sandbox's /proc (empty files and directories); a warm run's /proc shows processes only (subset=pid, see
# inside/kernel.PROC_MOUNT). A run's own view of itself (/proc/self, its namespace's processes) stays.
PROC_MASKED = (
    "stat", "vmstat", "loadavg", "uptime", "meminfo", "schedstat", "interrupts", "softirqs", "diskstats",
    "zoneinfo", "buddyinfo", "pagetypeinfo", "slabinfo", "locks", "key-users", "cgroups", "timer_list",
    "pressure", "sys/fs",
)  # fmt: skip


EMPTY_FILE = ".empty"  # in every code directory: what masks a /proc file (see prepare_code_dir)


def _proc_masks(code_dir: Path) -> list[str]:
    """bwrap arguments that mask PROC_MASKED (those this kernel has) in the sandbox's /proc: an empty
    read-only tmpfs over a directory, an empty read-only file over a file (/dev/null would not open there:
    /proc is mounted nodev)."""
    args = []
    for name in PROC_MASKED:
        path = f"/proc/{name}"
        if os.path.isdir(path):
            args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            args += ["--ro-bind", str(code_dir / EMPTY_FILE), path]
    return args


def bwrap_argv(bwrap: str, python: str, code_dir: Path, tmp_bytes: int, info_fd: int,
               shm_bytes: int = Limits.shm_bytes, seccomp: int | None = None, admin: bool = False) -> list[str]:
    """``admin``: the command keeps CAP_SYS_ADMIN and CAP_SETPCAP in the sandbox's own user namespace (the
    warm pool's server, which makes each run's namespaces and /proc, and drops both before any run code
    exists)."""
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",  # no nested namespaces from inside
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into the host's terminal
        "--cap-drop", "ALL",
        *(["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"] if admin else []),
        "--hostname", "sandbox",
        *_root_layout(python),
        "--proc", "/proc",
        # The warm pool's server and runs mount /procs of their own (inside/kernel.PROC_MOUNT): the kernel lets
        # them only while the /proc above has no mounts over its files.
        *(_proc_masks(code_dir) if not admin else []),
        "--dev", "/dev",  # null, zero, full, random, urandom, tty, pts: no host devices
        "--size", str(shm_bytes), "--tmpfs", "/dev/shm",  # size-capped: not a way into host memory
        "--remount-ro", "/dev",  # no files in /dev (the device nodes themselves stay usable)
        "--size", str(tmp_bytes), "--tmpfs", "/tmp",  # size-capped
        "--ro-bind", str(code_dir), "/code",
        "--remount-ro", "/",
        "--chdir", "/tmp",
        "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        "--info-fd", str(info_fd),
        *(["--seccomp", str(seccomp)] if seccomp is not None else []),
        "--",
    ]  # fmt: skip


def _clean_env() -> dict[str, str]:
    # bwrap gets this too (it is the sandbox's init); nothing of the trainer's environment leaks.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}


def _pump(proc: subprocess.Popen, out_fd: int, deadline: float, cap: int,
          info_fd: int | None) -> tuple[str, bytes, bytes, bool]:
    """Read the run's stdout (``out_fd``, up to cap + 1 bytes) and stderr (keep the tail) until EOF or the
    deadline.

    Also reads bwrap's info fd, whose ``child-pid`` is the sandbox's PID-namespace init: killing that
    process makes the kernel kill everything in the namespace *before* the init itself is reaped, so
    once bwrap has exited nothing of the run is left (killing only the outer bwrap would leave the
    teardown to the host's init, asynchronously).
    Returns (status, stdout, stderr tail, whether the sandbox started).
    """
    out, err, info = bytearray(), bytearray(), bytearray()
    status = "exited"
    with selectors.DefaultSelector() as sel:
        sel.register(out_fd, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        if info_fd is not None:
            sel.register(info_fd, selectors.EVENT_READ, info)
        open_streams = 2
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 65536)
                buf = key.data
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= buf is not info
                elif buf is out:
                    out += chunk[: cap + 1 - len(out)]
                    if len(out) > cap:
                        status = "output_limit"
                        break
                elif buf is err:
                    err += chunk
                    del err[:-STDERR_KEEP]
                elif len(info) < 4096:
                    info += chunk
            if status != "exited":
                break
    ns_init = _child_pid(bytes(info))
    if status == "exited":
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            status = "timeout"  # closed its pipes but kept running
    if status != "exited":
        kill_tree(proc, ns_init)
    if ns_init is not None:
        _wait_dead(ns_init)
    proc.stderr.close()
    return status, bytes(out), bytes(err), ns_init is not None or info_fd is None


def _child_pid(info: bytes) -> int | None:
    """bwrap's info JSON ({"child-pid": N, ...}) -> N, or None if set-up never got that far."""
    try:  # only the first JSON document: bwrap writes it before any untrusted code runs
        pid = json.JSONDecoder().raw_decode(info.decode().lstrip())[0].get("child-pid")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 1 else None


def _wait_dead(pid: int, timeout_s: float = 5.0) -> None:
    """Wait until the namespace init is dead (a zombie or gone).

    The outer bwrap exits as soon as the init *reports* the command's exit status, while the init may
    still be tearing the namespace down (the kernel kills and reaps every process in it before the init
    turns zombie). Waiting here means that when a run returns, no process of it is left.
    """
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if state in (b"Z", b"X"):
            return
        time.sleep(0.002)
    log.warning("sandbox namespace init %d still alive %.0f s after its run ended", pid, timeout_s)


def kill_tree(proc: subprocess.Popen, ns_init: int | None = None) -> None:
    """Kill a run and return only once every process of it is dead.

    Isolated: SIGKILL the namespace's init (still the outer bwrap's child, so its pid cannot have been
    reused); the kernel kills the whole namespace, then bwrap exits. Unsandboxed or if that fails: SIGKILL
    the process group.
    """
    if ns_init is not None and proc.poll() is None:
        try:
            os.kill(ns_init, signal.SIGKILL)
            proc.wait(timeout=10)
            return
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


def prepare_code_dir(root: Path, source: str) -> Path:
    """root/code with solution.py and _harness.py (inside/harness.py), readable (not writable) by the sandbox's uid."""
    os.chmod(root, 0o711)
    code = root / "code"
    code.mkdir(mode=0o755)
    (code / "solution.py").write_text(source, encoding="utf-8", errors="surrogatepass")
    shutil.copyfile(HARNESS_SOURCE, code / "_harness.py")
    (code / EMPTY_FILE).touch()
    for f in code.iterdir():
        os.chmod(f, 0o644)
    return code


def force_rmtree(path: Path) -> None:
    """rmtree that also removes what a program made unreadable (chmod 000 dirs) under our own uid."""

    def fix(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, onerror=fix)
            else:
                func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)


@functools.lru_cache(maxsize=None)
def _probe_cached(bwrap: str | None, python: str, uid: int | None) -> str | None:
    if bwrap is None:
        return "bwrap not found on PATH"
    root = Path(tempfile.mkdtemp(prefix="vt-sandbox-probe-"))
    try:
        code = prepare_code_dir(root, "print(6 * 7)\n")
        sandbox = object.__new__(Sandbox)
        sandbox.python, sandbox.bwrap, sandbox.isolated, sandbox.cgroups = python, bwrap, True, None
        r = sandbox.run(code, "stdin", b"", Limits(wall_s=30.0), uid)
    except OSError as e:
        return f"could not start bwrap: {e}"
    finally:
        force_rmtree(root)
    if r.status == "exited" and r.returncode == 0 and r.stdout.strip() == b"42":
        return None
    return f"bwrap test run failed ({r.status}, exit {r.returncode}): {r.stderr_tail[-300:].decode(errors='replace')}"


def probe(bwrap: str | None, python: str, uid: int | None) -> str | None:
    """None if a sandboxed hello-world works here, else why not. Cached per process."""
    return _probe_cached(bwrap, python, uid if uid is None else _UID_BASE)  # any non-root uid will do
