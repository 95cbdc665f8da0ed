"""A warm run's init: PID 1 of a new PID namespace (with a new mount and IPC namespace), made by the server for
each run. It makes the run's mounts, drops every capability, forks the run's process (PID 2, as the harness is
in a fresh sandbox, its parent PID 1), watches the run (supervise.py), then kills and reaps every other process
of its namespace and reports the run on a pipe. Runs inside the sandbox (a part of pool_server.py); Python
stdlib only, never imports vt.

How the init is made (``Inits.start``). Where it can, the server clones it with CLONE_VM | CLONE_VFORK: the
init shares the server's memory and runs the server's Python (a ctypes callback, with the server's thread state)
on a stack of its own, while the server sleeps in clone() until the init has exited. So the init costs no copy
of the server's page tables, no copy-on-write faults and no teardown of a copied address space (a fork of the
warm interpreter and its exit cost ~2 ms of CPU a run on a 2-core VM; the run's own process still is a fork,
of the init). Nothing of the run's reaches the server this way: the run's process is a fork (its own copy of
memory), and forked only after the init has made its namespaces and dropped its capabilities; what the init
creates for the run (pipes, its namespaces, its capabilities, rlimits, nice value, affinity, signal
dispositions: all per process) is its own, and its fd table is a copy (no CLONE_FILES), so the server's table
never holds the run's pipes. Its mappings are the server's: the output buffers it fills (framing.Output) are
the server's, and the run's process unmaps its copies before any of its code runs (run_process).
The run's processes can signal the init only with signals it handles (none: PID 1 of a namespace), cannot
trace it or read its memory or fds (not dumpable, as the server), and can change only its own per-process
settings (nice value, affinity, rlimits): a starved init is cut off by the host's deadline and the server is
replaced; an init that ends without its report (killed, crashed) marks the server unclean (replaced).
Where CLONE_VM cannot serve (a Python that checks its C stack against its thread's, 3.14 on; a kernel that
refuses the flags), the init is a plain fork of the server into a new PID namespace: the same init, slower.
"""
import ctypes
import json
import mmap
import os
import resource
import signal
import sys

from kernel import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_NODEV,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_NAME,
    PR_SET_NO_NEW_PRIVS,
    PROC_MOUNT,
    _libc,
    drop_capabilities,
    remove_tree,
)

_exit = os._exit
CLONE_VM, CLONE_VFORK, SIGCHLD = 0x100, 0x4000, 17
MAX_RETIRING = 8  # inits of finished runs left to exit on their own before the server waits for one
RUN_INIT_NAME = b"vt-run-init"  # a run's init's comm; the run's process gets the interpreter's back
SETUP_FAILED = -1  # what a run's init reports when it could not make the run's namespaces (init_main)
SCRATCH = ("/tmp", "/dev/shm")
# The init's own stack (CLONE_VM: it cannot use the server's); the run's process, forked from the init, runs on
# its copy of it, so it is as large as a fresh process's main stack may grow (RLIMIT_STACK, at most 8 MiB).
MAX_STACK = 8 << 20
_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def _stack_bytes():
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return MAX_STACK if soft == resource.RLIM_INFINITY or soft > MAX_STACK else max(soft, 1 << 20)


class Inits:
    """The server's runs' inits: ``start(job)`` makes one and returns its report; those that reported but are
    still exiting (``retiring``: their namespaces' teardown waits for the kernel) are reaped later."""

    def __init__(self, config, modes):
        """``config``: the server's (its "tmp_bytes", "shm_bytes"); ``modes``: /tmp's and /dev/shm's modes, which
        the run's fresh ones get."""
        self.retiring = set()
        # A run's mounts (init_main), as mount(2) takes them, encoded once here rather than in every init.
        sizes = {"/tmp": config["tmp_bytes"], "/dev/shm": config["shm_bytes"]}
        self.run_mounts = [(None, b"/", None, MS_REC | MS_PRIVATE, None)]  # nothing it mounts reaches our view
        self.run_mounts += [(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                             b"size=%d,mode=%o" % (sizes[d], modes[d])) for d in SCRATCH]
        self.run_mounts.append(PROC_MOUNT)
        self.vm = sys.version_info < (3, 14) and hasattr(_libc, "clone")
        if self.vm:
            size = _stack_bytes()
            self.stack = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.stack_top = (ctypes.addressof(ctypes.c_char.from_buffer(self.stack)) + size - 64) & ~15
            self.entry = _ENTRY(self._entry)  # kept: the callback must outlive every clone
            _libc.clone.restype = ctypes.c_int
            _libc.clone.argtypes = [_ENTRY, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # the fork path returns to it
        self._call = None

    def check(self):
        """One empty run before the first request: a server that cannot make a run's namespaces on this host
        must not start (the host reports a sandbox error), rather than fail every run as if its answer had."""
        report = self.start(lambda: {"status": "exited", "code": 0})
        if report.get("code") != 0:
            raise RuntimeError("cannot make a run's namespaces here (its init reported %r)" % (report,))

    def start(self, job):
        """Make a run's init, which runs ``job()`` (a dict, the run's report) as PID 1 of the run's namespaces,
        and return that report once the init has made it: {"code": SETUP_FAILED} when the namespaces could
        not be made, {"lost": True} when the init ended without a report."""
        while len(self.retiring) > MAX_RETIRING:  # inits still tearing their namespaces down: wait for one
            self.retiring.discard(os.waitpid(next(iter(self.retiring)), 0)[0])
        status_r, status_w = os.pipe()
        try:
            pid = self._spawn(status_w, job)
            os.close(status_w)
            status_w = None
            report = _read_report(status_r)
        finally:
            os.close(status_r)
            if status_w is not None:
                os.close(status_w)
        if report is None:  # no report: it died (or never ran); reap it now
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            return {"lost": True}
        self.retiring.add(pid)
        return report

    def _spawn(self, status_w, job):
        if self.vm:
            self._call = (status_w, job)
            try:
                pid = _libc.clone(self.entry, self.stack_top, CLONE_VM | CLONE_VFORK | CLONE_NEWPID | SIGCHLD, None)
                errno = ctypes.get_errno()
            finally:
                self._call = None
            if pid > 0:
                return pid  # it has exited already (CLONE_VFORK): its report is in the pipe
            if errno not in (22, 38):  # a real failure (no memory, no pids) rather than flags refused
                raise OSError(errno, "clone(CLONE_VM) failed")
            self.vm = False  # EINVAL, ENOSYS: fork from now on
        if _libc.unshare(CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")
        try:
            pid = os.fork()
            if pid == 0:
                _exit(self.init_main(status_w, job))
        finally:
            if _libc.setns(self.pidns, CLONE_NEWPID) != 0:
                raise OSError(ctypes.get_errno(), "setns(own PID namespace) failed")
        return pid

    def _entry(self, _arg):
        """The cloned init's first Python (CLONE_VM): its return value is its exit status."""
        try:
            status_w, job = self._call
            return self.init_main(status_w, job)
        except BaseException:  # noqa: BLE001 - nothing may unwind out of the callback; no report: lost
            return 125

    def init_main(self, status_w, job):
        """PID 1 of a run's own namespaces: a new mount namespace with a fresh tmpfs at /tmp and /dev/shm (their
        sizes, modes as the sandbox's) and a /proc of the run's PID namespace (run_mounts), a new IPC namespace;
        then every capability goes (the bounding set went in the server; no new privileges), and only then
        ``job()`` runs (it forks the run's process and watches it; see pool_server.Server.run_job). When it
        returns, every other process of the namespace is dead and reaped; the run's files go, and the report
        is written on ``status_w``. The exit status (125: no report)."""
        try:
            _libc.prctl(PR_SET_NAME, RUN_INIT_NAME, 0, 0, 0)
            if _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            for source, target, fstype, flags, data in self.run_mounts:
                if _libc.mount(source, target, fstype, flags, data) != 0:
                    raise OSError(ctypes.get_errno(), "mount %s" % target)
            drop_capabilities()
            if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        except BaseException:  # noqa: BLE001 - a run whose namespaces could not be made runs nothing
            return 125 if _write_report(status_w, {"code": SETUP_FAILED}) else 125
        try:
            report = job()
        finally:
            kill_and_reap()
        for d in SCRATCH:  # the run's files go now: their pages must not wait for the namespace's teardown
            try:
                for name in os.listdir(d):
                    remove_tree(os.path.join(d, name))
            except (OSError, RecursionError):
                pass
        return 0 if _write_report(status_w, report) else 125


def kill_and_reap():
    """As a namespace's init: SIGKILL every other process of the namespace (one pass, under the kernel's task
    list lock: a fork bomb cannot outrun it) and reap them all."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def exit_code_of(wait_status):
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code  # a signal death reads as bwrap reports it


def _write_report(fd, report):
    data = json.dumps(report).encode()
    try:
        return os.write(fd, len(data).to_bytes(4, "big") + data) == len(data) + 4  # < PIPE_BUF: one write
    except OSError:
        return False


def _read_report(fd):
    """The init's report, or None if it ended without one (EOF once every copy of the write end is gone)."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
        if len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
            break
    if len(data) < 4 or len(data) != 4 + int.from_bytes(data[:4], "big"):
        return None
    try:
        report = json.loads(data[4:])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
