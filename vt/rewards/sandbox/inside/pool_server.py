"""The warm sandbox server: one per worker slot, inside that slot's bwrap sandbox (see warm.py's
SandboxPool, which starts it). Python stdlib only; it never imports vt and never runs candidate code itself.

Usage (by warm.py, PoolWorker._start): python3 -I /code/pool/pool_server.py REQUESTS_FD,REPLIES_FD CONFIG_JSON
  (its parts next to it in /code/pool, /code/_harness.py and solution.py beside). The protocol's two pipes
  are inherited fds (bwrap's own stdio is /dev/null: see cold.channel_arg); CONFIG_JSON: {"tmp_bytes",
  "shm_bytes"}, the sizes of each run's /tmp and /dev/shm (see inits.Inits.init_main).

Its parts, each a file of /code/pool (imported from there at start-up, then taken off sys.path and
sys.modules, so that a run's interpreter looks as a fresh one):
  pool_server.py  the server: start-up, the request loop, each run's start and reply, the clean-up after it
  inits.py        a run's namespaces and its init (PID 1), which forks the run's process (PID 2)
  run_process.py  what the run's process becomes: the harness on the run's stdio, or a program test's solution
  supervise.py    watching a run: its output, wall clock, its init's report, the tester's verdict
  tester.py       the process that runs program tests (see Tester)
  framing.py      the protocol's framing, and the buffers that hold a run's stdin and output
  kernel.py       libc calls (mount, capabilities, System V IPC) and the checks and clean-ups built on them

It imports the harness (and the modules solutions commonly use) once, then serves runs one at a time: each run
is one forked child that becomes exactly what ``python3 -I /code/_harness.py LIMITS MODE`` would be in a fresh
sandbox (its own session, stdio, rlimits, signal dispositions, cwd /tmp), and only that child ever sees the
solution. Each run starts in namespaces of its own, as a fresh sandbox does (inits.py): the child is
PID 2 of a new PID namespace under an init the server makes for the run (PID 1; cloned with the server's
memory, it watches the run while the server waits), with a new mount namespace (a fresh
size-capped tmpfs at /tmp and /dev/shm, a /proc of its own PID namespace that shows processes only) and a
new IPC namespace. So what a run can observe starts the same for every run: its pids, the inode numbers of
its files, System V IPC ids, the processes /proc lists (the server and the tester are not among them, and no
pid of theirs can be named from a run, so no run can signal, renice or move them). The server holds
CAP_SYS_ADMIN in the sandbox's user namespace for this alone; each run's init drops every capability (and
the bounding set) before the run's process exists. A program test's child is the solution's process of the
harness's program mode; its test program runs in the Tester, a process forked once beside the server that serves
program test after program test (one fork a run where the cold harness makes two; see Tester). When the run
ends (exit, wall clock, output cap), its init kills and reaps every other process of its namespace (setsid
daemons and fork bombs included) and reports; its namespaces (files, IPC objects, mounts) go with it. The
server then checks that no process is left but its own, that its nice value, scheduling policy and rlimits are
as they were (else it reports itself unclean and the host replaces it), moves itself back to its CPU, and only
then replies. So nothing a run leaves (files, processes, locks, IPC objects, counters; modules, globals,
environment, signal handlers: those live in the child's own copy of the interpreter) reaches the next run.

The server is not dumpable (PR_SET_DUMPABLE 0): a process of the same uid can neither ptrace it nor open
its /proc files (memory, fds). It blocks the signals a process could send it except SIGKILL and SIGSTOP,
which cannot be blocked: a server killed or stopped stops replying, and the host then kills the whole
namespace and starts a fresh one.

Protocol, on the server's original stdin (requests) and stdout (replies), moved to private fds: each
message is an 8-byte big-endian length, a JSON header, then the raw payloads the header announces.
  server -> host, once:  {"ready": true}
  host -> server:        {"mode": str, "limits": LIMITS_JSON, "wall_s": float, "output_bytes": int,
                          "stdin": n}  + n bytes of stdin
  server -> host:        {"status": "exited"|"timeout"|"output_limit"|"sandbox_error", "returncode": int|null,
                          "wall_s": float, "clean": bool, "stdout": n, "stderr": m}
                         + n bytes of stdout (at most output_bytes + 1) + m bytes of stderr (its tail)
"clean" is false when the server could not clear the namespace or undo what the run changed in it; the host
then replaces it.
"""
import ctypes
import gc
import importlib.util
import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the parts, next to this file (-I leaves it out)
from framing import Output, copy_stdin, send  # noqa: E402
from inits import SCRATCH, SETUP_FAILED, Inits  # noqa: E402
from kernel import (  # noqa: E402
    CAP_SYS_ADMIN_MASK,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_DUMPABLE,
    _libc,
    close_all_but,
    drop_bounding_set,
    mount,
    mount_proc,
    remove_sysv_ipc,
    scheduling,
    set_capabilities,
    wipe,
)
from run_process import RunProcess  # noqa: E402
from supervise import supervise  # noqa: E402
from tester import Tester  # noqa: E402

del sys.path[0]  # a run's sys.path and sys.modules are a fresh interpreter's: no part of ours is importable
for _part in ("framing", "inits", "kernel", "run_process", "supervise", "tester"):
    del sys.modules[_part]

# The test kinds (a request's "mode"), a copy of vt.rewards.code.tests.MODES (the server never imports vt;
# tests/rewards/test_code_programs.py checks that the copies agree). A program test runs in two processes here:
# the solution's (a run's) and the tester's.
MODES = ("stdin", "call", "program")
TESTED_MODES = ("program",)
HARNESS = "/code/_harness.py"
STDERR_KEEP = 8192  # as cold.STDERR_KEEP: the tail of stderr the host keeps
_exit = os._exit  # a run may rebind os._exit in its own copy of the interpreter; it must still end here
# Imported once here so that runs start warm; each child gets its own copy-on-write view of them. Only
# what solutions import all the time (HumanEval's prompts import typing): every page of the server is
# copied into each run's page tables at fork, which costs more than a rare import in the child. Never a
# module that registers an at-fork hook (threading, random): the hook runs in every forked process (two
# per program test) and touches, so copies, about 150 pages of the server per fork (threading's) or 40
# (random's reseed): more than a run's own work on a short test. The few runs that use them import them.
WARM_MODULES = (
    "collections", "collections.abc", "functools", "itertools", "heapq", "bisect", "math", "re", "string",
    "typing", "copy", "operator",
)  # fmt: skip
# Signals a run could send to the server (same uid) to disturb it. The server blocks them rather than
# ignoring them: a blocked signal stays pending and is never delivered, the dispositions stay the fresh
# interpreter's, and a forked child starts with no pending signal (fork clears them), so it only has to
# unblock. SIGKILL and SIGSTOP cannot be blocked: the host replaces a server they reach.
SHIELDED = (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
    signal.SIGVTALRM, signal.SIGPROF, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE,
    signal.SIGXCPU, signal.SIGXFSZ, signal.SIGURG, signal.SIGWINCH, signal.SIGIO, signal.SIGTRAP,
)  # fmt: skip


def load_harness():
    spec = importlib.util.spec_from_file_location("_harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Server:
    def __init__(self, channels, config):
        # The protocol's pipes are inherited fds; 0 and 1 stay /dev/null until a child takes them over.
        self.requests, self.replies = (int(fd) for fd in channels.split(","))
        config = json.loads(config)
        # A mount namespace of our own with a /proc of our PID namespace (bwrap's shows its own): our pids
        # and those of /proc agree (others, kill_all), as they will in each run's.
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount_proc()
        self.me = os.getpid()
        # Not dumpable (main, before the fork that made us): a process of our uid can neither trace us nor
        # open our /proc files. PID 1 of our namespace: orphans of every run's init are re-parented to us.
        signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
        # Capabilities: the bounding set goes now, once (it needs CAP_SETPCAP, which goes with it), and only
        # CAP_SYS_ADMIN stays: every process forked from here then sheds its capabilities with one capset.
        drop_bounding_set()
        set_capabilities(CAP_SYS_ADMIN_MASK)
        self.harness = load_harness()
        self.harness.warm_up()  # what the harness would otherwise look up in every run
        for name in WARM_MODULES:
            __import__(name)
        # The CPU(s) the host started us on (warm.claim_cpu): a run (same uid) may move us, and we move back.
        self.affinity = os.sched_getaffinity(0)
        # What else a run (same uid) can change in this process from outside, no ptrace needed, that every
        # later run would inherit: see scheduling().
        self.scheduling = scheduling()
        self.tester = None  # program tests' Tester, started by the first program run (and after a loss)
        self.broken = False  # a run's init could not make its namespaces (finish): we are to be replaced
        self.scratch = {}  # what /tmp and /dev/shm look like before any run, restored after each
        for d in SCRATCH:
            st = os.stat(d)
            self.scratch[d] = (st.st_mode & 0o7777, st.st_atime_ns, st.st_mtime_ns)
        with open("/proc/self/comm", "rb") as f:
            comm = f.read().strip()
        umask = os.umask(0o022)
        os.umask(umask)
        self.run_process = RunProcess(self.harness, HARNESS, comm, umask)
        self.inits = Inits(config, {d: mode for d, (mode, _, _) in self.scratch.items()})
        # Everything allocated so far is the server's: out of the garbage collector's sight, so that a
        # collection in a run's child never walks (and so copies, page by page) the inherited heap.
        gc.collect()
        gc.freeze()

    def serve(self):
        self.inits.check()
        send(self.harness, self.replies, {"ready": True})
        while True:
            request = self.harness.recv(self.requests)  # the header; its payload: copy_stdin
            if request is None:
                return  # the host closed the pipe
            # (Python < 3.9 in the sandbox has no socket.send_fds: the harness's own program mode there.) The
            # tester is forked first, so that it holds neither this run's stdin nor its output buffers.
            tested = request["mode"] in TESTED_MODES and hasattr(socket, "send_fds")
            tester = self.tester_ready() if tested else None
            stdin_fd = copy_stdin(self.requests, request["stdin"])
            out, err = Output(int(request["output_bytes"])), Output(STDERR_KEEP, keep_tail=True)
            try:
                reply = self.run(request, stdin_fd, out, err, tester)
                reply["clean"] = self.clear()
                reply["stdout"], reply["stderr"] = len(out.data()), len(err.data())
                send(self.harness, self.replies, reply, out.data(), err.data())
            finally:
                out.close()
                err.close()

    def run(self, request, stdin_fd, out, err, tester=None):
        """One run in its own init (inits.Inits.start), which runs ``run_job``; the reply's status, returncode
        and wall_s. A program test's returncode is the tester's verdict (0: passed)."""
        try:
            report = self.inits.start(lambda: self.run_job(request, stdin_fd, out, err, tester))
            if report.get("tester_lost"):  # it died between runs (none of this run's code ran): a fresh one
                self.retire_tester()
                tester = self.tester_ready()
                report = self.inits.start(lambda: self.run_job(request, stdin_fd, out, err, tester))
        finally:
            os.close(stdin_fd)
        if report.get("code") == SETUP_FAILED or report.get("lost") or report.get("tester_lost"):
            # No code of the run ran (its namespaces could not be made), or its init ended without a report
            # (it shares our memory: nothing of it is trusted): we are to be replaced.
            self.broken = True
            if report.get("lost"):
                return {"status": "exited", "returncode": 128 + signal.SIGKILL, "wall_s": 0.0}
            return {"status": "sandbox_error", "returncode": None, "wall_s": 0.0}
        out.n, err.n = report["out_n"], report["err_n"]  # (a forked init filled the shared buffers, not ours)
        status, code, verdict = report["status"], report["code"], report.get("verdict")
        if tester is None:
            return {"status": status, "returncode": code, "wall_s": report["wall"]}
        if not verdict:  # no verdict (cut off, or the tester died): it may be mid-run, so it goes
            self.retire_tester()
        return {"status": status, "returncode": 0 if verdict else 1, "wall_s": report["wall"]}

    def run_job(self, request, stdin_fd, out, err, tester):
        """In the run's init (PID 1 of its namespaces, no capabilities left): fork the run's process (PID 2)
        and watch it (supervise). A stdin or call run: the harness on the run's stdio. A program test: the
        solution in the run's process (the harness's serve_solution, on pipes to the tester), the test program
        in the tester (Tester), which reads the request and writes the verdict on the run's stdout. Only the
        run's process sees candidate code; it never holds the request (its nonce and test code: the memfd goes
        to the tester), the run's stdout or the tester's memory (the tester is not dumpable). One fork a run,
        where the harness alone (cold path) forks twice. Every pipe of the run is made here, in the init's own
        fd table: the server never holds one, so each closes when the run's processes and the tester are done."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if tester is None:
            body, fds, theirs = "harness", [stdin_fd, out_w, err_w], []
        else:
            call_r, call_w = os.pipe()  # tester -> solution: calls
            reply_r, reply_w = os.pipe()  # solution -> tester: ready, replies
            body, fds, theirs = "solution", [err_w, call_r, reply_w], [stdin_fd, out_w, call_w, reply_r]
            try:
                socket.send_fds(tester.sock, [b"run"], theirs)
            except OSError:
                return {"tester_lost": True}
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            self.run_process.become(request, body, fds, (out, err))  # never returns
        for fd in set(fds + theirs):
            os.close(fd)
        status, code, verdict, wall = supervise(pid, start, float(request["wall_s"]), out, err, out_r, err_r,
                                                tester)
        return {"status": status, "code": code, "verdict": verdict, "wall": wall, "out_n": out.n, "err_n": err.n}

    # ---- the tester ------------------------------------------------------------------------------

    def tester_ready(self):
        """The tester, started first if there is none (the first program run, or after one was lost)."""
        if self.tester is None:
            self.tester = Tester.start(self.harness, self.close_own_fds)
        return self.tester

    def close_own_fds(self):
        """In a process forked from us that is not a run's (the tester): close what is the server's alone."""
        os.close(self.requests)
        os.close(self.replies)
        os.close(self.inits.pidns)

    def retire_tester(self):
        if self.tester is not None:
            self.tester.kill()
            self.tester = None

    # ---- between runs ----------------------------------------------------------------------------

    def kill_all(self, timeout_s=5.0):
        """SIGKILL every process of the namespace but us, until none is left, if a run left any.

        A run's processes live in its own PID namespace, which dies with the run's init, and an init reports
        only once every other process of its namespace is gone (inits.Inits.init_main): after a run, none is
        left but the tester and inits still exiting. Should one be (others), kill(-1) signals every process we
        may signal in our PID namespace and those below it, except ourselves, in one pass under the kernel's
        task-list lock, so a fork bomb cannot outrun it; the tester goes with it (a fresh one starts when
        needed)."""
        self.reap()
        if not self.others():
            return True
        self.retire_tester()
        end = time.monotonic() + timeout_s
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                # ESRCH: kill(-1) found no process at all but init and us (a zombie counts as one), so
                # there is none to reap or look for in /proc: the common case, a run that left nothing.
                return True
            self.reap()
            if not self.others():
                return True
            if time.monotonic() > end:
                return False
            time.sleep(0.001)

    def reap(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.inits.retiring.discard(pid)
            if self.tester is not None and pid == self.tester.pid:  # it died (a run killed it)
                self.tester.sock.close()
                self.tester = None

    def others(self):
        """Every process of the namespace (and those below it) but us, our tester and the inits of runs that
        reported (each done with its run), zombies included."""
        spared = {1, self.me, self.tester.pid if self.tester is not None else 1} | self.inits.retiring
        return [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in spared]

    def clear(self):
        if self.broken:  # a run's namespaces could not be made: the host replaces us
            return False
        return self.clear_run()

    def clear_run(self):
        """After a run: no process, IPC object or scratch file of it is left. False if that failed. A
        tester the run disturbed (see Tester.intact) is replaced, not reported: it is not the server."""
        ok = self.kill_all()
        if self.tester is not None and not self.tester.intact(self.affinity):
            self.retire_tester()
        ok = remove_sysv_ipc() and ok
        try:
            os.sched_setaffinity(0, self.affinity)
        except OSError:
            ok = False
        ok = scheduling() == self.scheduling and ok
        for d, (mode, atime, mtime) in self.scratch.items():
            ok = wipe(d, mode, atime, mtime) and ok
        return ok


def main():
    # kill(-1) between runs must only ever reach a sandbox's own PID namespace: under bwrap this process is
    # pid 2 (bwrap's init is 1); anywhere else (a host, where pid 2 is the kernel's kthreadd) refuse.
    if os.getpid() != 2:
        sys.exit("pool_server.py runs only as the first process of a fresh PID namespace (bwrap)")
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_DUMPABLE, 0) failed")
    # The server is PID 1 of a PID namespace of its own making: only over a namespace that the sandbox's user
    # namespace owns (bwrap's is not) may it return to its own after forking each run into a new one
    # (Inits.fork_run: setns needs CAP_SYS_ADMIN there). This process stays as the server's parent and
    # ends with it, so bwrap's init sees its command end when the server does.
    if _libc.unshare(CLONE_NEWPID) != 0:
        sys.exit("unshare(CLONE_NEWPID) failed: errno %d" % ctypes.get_errno())
    pid = os.fork()
    if pid == 0:
        try:
            Server(sys.argv[1], sys.argv[2]).serve()
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, status 1
            sys.excepthook(*sys.exc_info())
            _exit(1)
        _exit(0)
    close_all_but((2,))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        _exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
