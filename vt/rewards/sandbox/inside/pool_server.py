"""The warm sandbox server: one per worker slot, inside that slot's bwrap sandbox (see warm.py's
SandboxPool, which starts it). Python stdlib only; it never imports vt and never runs candidate code itself.

Usage (by warm.py, PoolWorker._start): python3 -I /code/_pool_server.py REQUESTS_FD,REPLIES_FD CONFIG_JSON
  (next to /code/_harness.py and solution.py). The protocol's two pipes are inherited fds (bwrap's own stdio
  is /dev/null: see cold.channel_arg); CONFIG_JSON: {"tmp_bytes", "shm_bytes"}, the sizes of each run's
  /tmp and /dev/shm (see Server.run_init).

It imports the harness (and the modules solutions commonly use) once, then serves runs one at a time: each run
is one forked child that becomes exactly what ``python3 -I /code/_harness.py LIMITS MODE`` would be in a fresh
sandbox (its own session, stdio, rlimits, signal dispositions, cwd /tmp), and only that child ever sees the
solution. Each run starts in namespaces of its own, as a fresh sandbox does (Server.run_init): the child is
PID 2 of a new PID namespace under an init of the server's (PID 1), with a new mount namespace (a fresh
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
import atexit
import ctypes
import gc
import importlib.util
import json
import mmap
import os
import resource
import select
import signal
import socket
import sys
import time

HARNESS = "/code/_harness.py"
STDERR_KEEP = 8192  # as cold.STDERR_KEEP: the tail of stderr the host keeps
MAX_REQUEST = 1 << 30
MAX_HEADER = 1 << 16  # a run's header, as the server passes it to the run's init (launch)
# Inits forked ahead (prepare_init): one, forked as the server replies, makes its namespaces while the host reads
# the reply and sends the next request. (One stdin run repeated, loaded box: fastest 3.4-3.8 ms with one ahead,
# 4.0-4.1 with none; two ahead were no faster, one more process competing for the CPUs.)
INITS_AHEAD = 1
SCRATCH = ("/tmp", "/dev/shm")
_libc = ctypes.CDLL(None, use_errno=True)
_exit = os._exit  # a run may rebind os._exit in its own copy of the interpreter; it must still end here
PR_SET_NAME, PR_SET_DUMPABLE, IPC_RMID = 15, 4, 0
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
TESTER_NAME = b"vt-tester"  # the tester's /proc/PID/comm (its command line is the server's; warm.TESTER_NAME)
RUN_INIT_NAME = b"vt-run-init"  # a run's init's comm; the run's process gets ours back (child)
TESTER_GROWTH = 64 << 20  # resident bytes a tester may gain over its start before it is replaced
SETUP_FAILED = -1  # what a run's init reports when it could not make the run's namespaces (run_init)
VERDICT_GRACE_S = 0.5  # after a program test's verdict: for the solution's process to end before it is killed
MAX_RETIRING = 8  # inits of finished runs left to exit on their own before the server waits for one
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


# ---- framing -------------------------------------------------------------------------------------


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(harness, fd, header, *payloads):
    """The header framed as the harness frames its messages (8-byte length + JSON), then raw payloads."""
    harness.send(fd, header)
    for p in payloads:
        write_all(fd, p)


def copy_stdin(src, n):
    """A run's stdin (n bytes on the request pipe) -> a fresh anonymous memfd, through a buffer that is
    unmapped afterwards. A run's stdin may hold a program test's code and nonce, which the solution's
    process must never see: no copy of it may stay in this process's memory, which the next run's
    children inherit."""
    if not 0 <= n <= MAX_REQUEST:
        raise ValueError("stdin size out of range")
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    with mmap.mmap(-1, 1 << 16) as buf:
        view = memoryview(buf)
        try:
            while n:
                got = os.readv(src, [view[: min(n, len(buf))]])
                if not got:
                    raise EOFError("request pipe closed mid-request")
                write_all(fd, view[:got])
                n -= got
        finally:
            view.release()
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Output:
    """A run's stdout (up to cap + 1 bytes) or the tail of its stderr (``keep`` bytes), in an anonymous
    mapping that is unmapped after the reply: one run's output never stays in this process's memory."""

    def __init__(self, cap, keep_tail=False):
        self.cap, self.tail = cap, keep_tail
        self.buf = mmap.mmap(-1, max(1, 2 * cap if keep_tail else cap + 1))
        self.view = memoryview(self.buf)
        self.n = 0

    def read_from(self, fd):
        """Read what is there; 0 at end of file."""
        if self.tail and self.n == len(self.buf):
            self.buf.move(0, self.n - self.cap, self.cap)  # keep the last cap bytes
            self.n = self.cap
        if self.n == len(self.buf):
            return -1  # stdout past its cap: the caller has stopped the run already
        got = os.readv(fd, [self.view[self.n :]])
        self.n += got
        return got

    def full(self):
        return not self.tail and self.n > self.cap

    def data(self):
        return self.view[max(0, self.n - self.cap) : self.n] if self.tail else self.view[: self.n]

    def close(self):
        self.view.release()
        self.buf.close()


# ---- one run -------------------------------------------------------------------------------------


class Server:
    def __init__(self, channels, config):
        # The protocol's pipes are inherited fds; 0 and 1 stay /dev/null until a child takes them over.
        self.requests, self.replies = (int(fd) for fd in channels.split(","))
        self.config = json.loads(config)
        # A mount namespace of our own with a /proc of our PID namespace (bwrap's shows its own): our pids
        # and those of /proc agree (others, kill_all), as they will in each run's.
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount_proc()
        # Our own PID namespace, to return to after each run's fork into a new one (fork_run).
        self.pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.me = os.getpid()
        with open("/proc/self/comm", "rb") as f:
            self.comm = f.read().strip()
        self.umask = os.umask(0o022)
        os.umask(self.umask)
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
        self.retiring = set()  # inits of runs that reported, still exiting (supervise), not reaped yet
        self.broken = False  # a run's init could not make its namespaces (supervise): we are to be replaced
        self.next_inits = []  # (pid, status pipe, socket) of the next runs' inits, forked ahead (prepare_init)
        self.scratch = {}  # what /tmp and /dev/shm look like before any run, restored after each
        for d in SCRATCH:
            st = os.stat(d)
            self.scratch[d] = (st.st_mode & 0o7777, st.st_atime_ns, st.st_mtime_ns)
        # A run's mounts (run_init), as mount(2) takes them, encoded once here rather than in every init.
        sizes = {"/tmp": self.config["tmp_bytes"], "/dev/shm": self.config["shm_bytes"]}
        self.run_mounts = [(None, b"/", None, MS_REC | MS_PRIVATE, None)]  # nothing it mounts reaches our view
        self.run_mounts += [(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                             b"size=%d,mode=%o" % (sizes[d], self.scratch[d][0])) for d in SCRATCH]
        self.run_mounts.append(PROC_MOUNT)
        # Everything allocated so far is the server's: out of the garbage collector's sight, so that a
        # collection in a run's child never walks (and so copies, page by page) the inherited heap.
        gc.collect()
        gc.freeze()

    def serve(self):
        self.check_run_namespaces()
        self.prepare_init()
        send(self.harness, self.replies, {"ready": True})
        while True:
            request = self.harness.recv(self.requests)  # the header; its payload: copy_stdin
            if request is None:
                return  # the host closed the pipe
            stdin_fd = copy_stdin(self.requests, request["stdin"])
            out, err = Output(int(request["output_bytes"])), Output(STDERR_KEEP, keep_tail=True)
            try:
                # (Python < 3.9 in the sandbox has no socket.send_fds: the harness's own program mode there.)
                tested = request["mode"] == "program" and hasattr(socket, "send_fds")
                run = self.run_program if tested else self.run
                reply = run(request, stdin_fd, out, err)
                reply["clean"] = self.clear()
                reply["stdout"], reply["stderr"] = len(out.data()), len(err.data())
                send(self.harness, self.replies, reply, out.data(), err.data())
            finally:
                out.close()
                err.close()
            self.prepare_init()  # the next run's namespaces are made while the host reads this reply

    def run(self, request, stdin_fd, out, err):
        """A stdin or call run: one forked child, the harness on the run's stdio; the run is done when that
        child has exited and its stdout and stderr are closed."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        start = time.monotonic()
        pid, status_r = self.launch(request, "harness", [stdin_fd, out_w, err_w])
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
        return self.supervise(pid, status_r, start, request, out, err, out_r, err_r)

    def run_program(self, request, stdin_fd, out, err):
        """A program test: the solution in one forked child (the harness's serve_solution, on pipes to the
        tester), the test program in the tester (Tester), which reads the request and writes the verdict on
        the run's stdout. Only the child sees candidate code; the child never holds the request (its nonce
        and test code: the memfd goes to the tester), the run's stdout or the tester's memory (the tester is
        not dumpable). One fork a run, where the harness alone (cold path) forks twice."""
        tester = self.tester_ready()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        call_r, call_w = os.pipe()  # tester -> solution: calls
        reply_r, reply_w = os.pipe()  # solution -> tester: ready, replies
        start = time.monotonic()
        pid, status_r = self.launch(request, "solution", [err_w, call_r, reply_w])
        for fd in (err_w, call_r, reply_w):
            os.close(fd)
        try:
            socket.send_fds(tester.sock, [b"run"], [stdin_fd, out_w, call_w, reply_r])
        except OSError:  # it died between runs (no doing of this run's, which has not started): a fresh one
            self.retire_tester()
            tester = self.tester_ready()
            socket.send_fds(tester.sock, [b"run"], [stdin_fd, out_w, call_w, reply_r])
        for fd in (stdin_fd, out_w, call_w, reply_r):
            os.close(fd)
        return self.supervise(pid, status_r, start, request, out, err, out_r, err_r, tester)

    def serve_solution(self, request, call_r, reply_w):
        """The solution's process of a program test (in the forked child): the run's limits, then the
        harness's serve_solution; never returns."""
        self.harness.set_limits(json.loads(request["limits"]))
        self.harness.serve_solution(call_r, reply_w)

    def supervise(self, pid, status_r, start, request, out, err, out_r, err_r, tester=None):
        """Read the run's stdout and stderr until both are closed and its main part is done (its init has
        reported the run's status, see run_init; with ``tester``, the tester has also written the verdict),
        or until its wall clock or stdout cap. An init that reported is done with the run (every process of
        it is dead and reaped): it is left to finish exiting (its namespaces' teardown waits for the kernel)
        while we reply, and reaped later (``retiring``). Any other way out kills it and waits."""
        deadline = start + float(request["wall_s"])
        status, code, verdict = "exited", None, None
        tester_fd = tester.sock.fileno() if tester is not None else None
        poller = select.poll()
        for fd in (out_r, err_r, status_r, tester_fd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        open_fds = {out_r, err_r}

        def main_done():
            return code is not None and (tester is None or verdict is not None)

        try:
            while open_fds or not main_done():
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    status = "timeout"
                    break
                ready = poller.poll(max(1, int(left * 1000)))
                for fd, _ in ready:
                    if fd == status_r:
                        poller.unregister(status_r)
                        code = self.reported(pid, status_r)
                    elif fd == tester_fd:
                        poller.unregister(tester_fd)
                        verdict = tester.finished()
                        if code is None:
                            # The tester closed its end of the calls: the solution's process ends, and with
                            # it the run (its init reports). One that does not within the grace is killed.
                            deadline = min(deadline, time.monotonic() + VERDICT_GRACE_S)
                    elif (out if fd == out_r else err).read_from(fd) == 0:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                    elif out.full():
                        status = "output_limit"
                        break
                if status != "exited":
                    break
            wall = time.monotonic() - start
        finally:
            for fd in (out_r, err_r, status_r):
                os.close(fd)
        if code is None:
            try:
                os.kill(pid, signal.SIGKILL)
                code = self.exit_code_of(os.waitpid(pid, 0)[1])
            except (ProcessLookupError, ChildProcessError):
                pass
            if verdict is not None and status == "timeout":
                status = "exited"  # the verdict came in time; only the solution's process lingered
        if code == SETUP_FAILED:  # no code of the run ever ran: the sandbox failed, not the answer
            self.broken = True
            return {"status": "sandbox_error", "returncode": None, "wall_s": wall}
        if tester is not None:
            if not verdict:  # no verdict (cut off, or the tester died): it may be mid-run, so it goes
                self.retire_tester()
            returncode = 0 if verdict else 1
        else:
            returncode = code
        return {"status": status, "returncode": returncode, "wall_s": wall}

    def reported(self, pid, status_r):
        """The run's status as its init reports it (see run_init), the init then retiring; or, when the
        init ended without a report, its own exit status."""
        data = os.read(status_r, 4)
        if len(data) == 4:
            self.retiring.add(pid)
            return int.from_bytes(data, "big", signed=True)
        return self.exit_code_of(os.waitpid(pid, 0)[1])

    @staticmethod
    def exit_code_of(wait_status):
        code = os.waitstatus_to_exitcode(wait_status)
        return 128 - code if code < 0 else code  # a signal death reads as bwrap reports it

    # ---- a run's namespaces ---------------------------------------------------------------------

    def check_run_namespaces(self):
        """One empty run before the first request: a server that cannot make a run's namespaces on this host
        must not start (the host reports a sandbox error), rather than fail every run as if its answer had."""
        pid, status_r, status_w = self.fork_run()
        if pid == 0:
            self.run_init(status_w, lambda: _exit(0))  # never returns
        try:
            code = self.reported(pid, status_r)
        finally:
            os.close(status_r)
        if code != 0:
            raise RuntimeError("cannot make a run's namespaces here (its init reported %d)" % code)

    def prepare_init(self):
        """Fork the next run's init ahead of its request, where fds can be passed (socket.send_fds): it makes
        the run's namespaces and forks the run's process (run_init) while we wait; that process waits for
        the run's header and fds (launch, await_run)."""
        while len(self.next_inits) < INITS_AHEAD and hasattr(socket, "send_fds"):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid, status_r, status_w = self.fork_run()
            if pid == 0:
                ours.close()
                for _, other_r, other in self.next_inits:  # the server's, as its protocol pipes
                    os.close(other_r)
                    other.close()
                close_all_but((0, 1, 2, status_w, theirs.fileno()))
                self.run_init(status_w, lambda: self.await_run(theirs))  # never returns
            theirs.close()
            self.next_inits.append((pid, status_r, ours))

    def launch(self, request, body, fds):
        """Start a run (its header, its body and fds as run_body takes them) in the process an init forked
        ahead, or under an init forked now; (the init's pid, the read end of its status pipe)."""
        init = self.next_inits.pop(0) if self.next_inits else None
        if init is not None:
            pid, status_r, sock = init
            try:
                socket.send_fds(sock, [json.dumps([request, body]).encode()], fds)
                return pid, status_r
            except OSError:  # it died before any run (none of this run's code ran): a fresh one now
                os.close(status_r)
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            finally:
                sock.close()
        pid, status_r, status_w = self.fork_run()
        if pid == 0:
            self.run_init(status_w, lambda: self.run_body(request, body, fds)())  # never returns
        return pid, status_r

    def await_run(self, sock):
        """The run's process forked ahead (PID 2 of its namespace, under its init): wait for the run (launch)
        and become it; exit if none comes. Never returns."""
        msg, fds, _, _ = socket.recv_fds(sock, MAX_HEADER, 3)
        sock.close()
        if not msg:
            _exit(0)  # the server is gone, or gave up this init
        request, body = json.loads(msg)
        self.run_body(request, body, fds)()

    def run_body(self, request, body, fds):
        """What the run's process (forked by its init) does: a program test's solution, served to the
        tester ("solution"; fds: stderr, calls, replies), or the harness on the run's stdio ("harness";
        fds: stdin, stdout, stderr)."""
        if body == "solution":
            err_w, call_r, reply_w = fds
            return lambda: self.child(os.open(os.devnull, os.O_RDONLY), err_w, err_w, request,
                                      lambda: self.serve_solution(request, call_r, reply_w), keep=(call_r, reply_w))
        stdin_fd, out_w, err_w = fds
        return lambda: self.child(stdin_fd, out_w, err_w, request, self.harness.main)

    def fork_run(self):
        """fork() into a new PID namespace, whose PID 1 the child is (then run_init); the server stays in
        its own, and its next children (the tester) are born there again. (pid, the read end of the pipe
        the child reports the run's status on, its write end)."""
        while len(self.retiring) > MAX_RETIRING:  # inits still tearing their namespaces down: wait for one
            self.retiring.discard(os.waitpid(next(iter(self.retiring)), 0)[0])
        status_r, status_w = os.pipe()
        if _libc.unshare(CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")
        try:
            pid = os.fork()
        except BaseException:
            self.restore_pidns()
            raise
        if pid != 0:
            self.restore_pidns()
            os.close(status_w)
        return pid, status_r, status_w

    def restore_pidns(self):
        if _libc.setns(self.pidns, CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "setns(own PID namespace) failed")

    def run_init(self, status_w, run):
        """PID 1 of a run's own namespaces (in the forked child of fork_run); never returns.

        A new mount namespace with a fresh tmpfs at /tmp and /dev/shm (their sizes, modes as the sandbox's)
        and a /proc of the run's PID namespace (run_mounts); a new IPC namespace. Then every capability goes
        (the bounding set went in the server; no new privileges), and the run's process is forked at once
        (PID 2, as the harness is in a fresh sandbox) to do ``run()`` (an init forked ahead: wait for its
        run there, so that the fork is off the run's path). When it ends, the run ends: every other process
        of the namespace is killed and reaped, and only then is the run's status reported on ``status_w``
        (4 bytes, as bwrap reports an exit status) and we exit.

        This process is a copy of the warm server, and every page of it that its Python touches is copied
        once more (copy-on-write faults: a few microseconds each, hundreds per run), so it does as little
        as it can: its mounts are encoded in the server, and the run's request is the run's process's."""
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
            pid = os.fork()
        except BaseException:  # noqa: BLE001 - a run whose namespaces could not be made runs nothing
            try:
                os.write(status_w, SETUP_FAILED.to_bytes(4, "big", signed=True))
            except OSError:
                pass
            _exit(125)
        if pid == 0:
            os.close(status_w)  # the run's status is the init's to report
            run()  # never returns
            _exit(125)
        close_all_but((status_w,))  # the run's fds (and the socket of a run forked ahead) are the run's process's
        code = None
        while code is None:
            try:
                done, status = os.wait()
            except ChildProcessError:
                _exit(125)
            except InterruptedError:
                continue
            if done == pid:
                code = self.exit_code_of(status)
        try:
            os.kill(-1, signal.SIGKILL)  # as init: every other process of the namespace, in one pass
        except ProcessLookupError:
            pass
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        for d in SCRATCH:  # the run's files go now: their pages must not wait for the namespace's teardown
            try:
                for name in os.listdir(d):
                    remove_tree(os.path.join(d, name))
            except (OSError, RecursionError):
                pass
        os.write(status_w, code.to_bytes(4, "big", signed=True))
        _exit(code & 0xFF)

    def child(self, stdin_fd, out_w, err_w, request, body, keep=()):
        """Become a fresh ``python3 -I /code/_harness.py LIMITS MODE`` on this run's stdio (and the fds in
        ``keep``) and run ``body``; never returns."""
        try:
            os.setsid()  # its own session and process group: kill(0, ...) from the run cannot reach us
            _libc.prctl(PR_SET_NAME, self.comm, 0, 0, 0)  # the interpreter's name, not its init's
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            close_all_but((0, 1, 2) + tuple(keep))  # our protocol pipes included
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as any fresh process: /proc/self readable by itself
            try:  # memory pressure kills the run's processes first, never the server
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)  # no file object: fewer pages copied
                try:
                    os.write(fd, b"1000")
                finally:
                    os.close(fd)
            except OSError:
                pass
            fresh = self.harness.fresh_stdio
            sys.stdin, sys.stdout, sys.stderr = fresh(0), fresh(1), fresh(2)
            sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
            os.umask(self.umask)
            os.chdir("/tmp")
            # POSIX message queues are not files anywhere we could wipe: the run may create none.
            resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
            sys.argv = [HARNESS, request["limits"], request["mode"]]
        except BaseException:  # noqa: BLE001 - a child that could not be set up runs nothing
            _exit(125)
        code = 0
        try:
            body()  # the harness's modes end in os._exit themselves
        except SystemExit as e:
            code = exit_code(e.code)
        except BaseException:  # noqa: BLE001 - as the interpreter does: traceback on stderr, status 1
            try:
                sys.excepthook(*sys.exc_info())
            finally:
                code = 1
        _exit(finalize(code))

    # ---- the tester ------------------------------------------------------------------------------

    def tester_ready(self):
        """The tester, started first if there is none (the first program run, or after one was lost)."""
        if self.tester is None:
            self.tester = Tester.start(self)
        return self.tester

    def retire_tester(self):
        if self.tester is not None:
            self.tester.kill()
            self.tester = None

    # ---- between runs ----------------------------------------------------------------------------

    def kill_all(self, timeout_s=5.0):
        """SIGKILL every process of the namespace but us, until none is left, if a run left any.

        A run's processes live in its own PID namespace, which dies with the run's init, and an init reports
        only once every other process of its namespace is gone (run_init): after a run, none is left but
        the tester, the inits forked ahead and inits still exiting. Should one be (others), kill(-1)
        signals every process we may signal in our PID namespace and those below it, except ourselves, in
        one pass under the kernel's task-list lock, so a fork bomb cannot outrun it; the tester and the
        inits forked ahead go with it (fresh ones start when needed)."""
        self.reap()
        if not self.others():
            return True
        self.retire_tester()
        for pid, status_r, sock in self.next_inits:
            os.close(status_r)
            sock.close()
        self.next_inits = []
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
            self.retiring.discard(pid)
            if self.tester is not None and pid == self.tester.pid:  # it died (a run killed it)
                self.tester.sock.close()
                self.tester = None

    def others(self):
        """Every process of the namespace (and those below it) but us, our tester, the inits forked ahead (and
        the run processes they forked, waiting for their runs) and those of runs that reported (each done with
        its run: see supervise), zombies included."""
        spared = {1, self.me, self.tester.pid if self.tester is not None else 1} | self.retiring
        ahead = {pid for pid, _, _ in self.next_inits}
        found = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in spared and int(p) not in ahead]
        return [p for p in found if parent_of(p) not in ahead] if found and ahead else found

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


class Tester:
    """The process that runs program tests (HumanEval's ``check``, MBPP's asserts) against a run's solution
    in the warm pool: forked from the server, before any run, once, and serving run after run, so that a
    program test costs one fork (the solution's), not two. It never runs candidate code: it gets each run's
    request (a memfd: nonce, setup and test code), the run's stdout, and the call pipes to the solution's
    process over a socket (SCM_RIGHTS), runs the harness's run_tests with stand-ins that call the solution
    by value (as the cold path's test process does), writes the verdict line and says so.

    The run's processes have its uid, so the kernel lets them signal it, change its priority, scheduling
    policy, CPU affinity and rlimits, but not trace it or read its memory or fds (it is not dumpable, as
    the server). So no run can make it report a pass for another: a kill or a stop costs the run its
    verdict (it fails); the server replaces a tester that gave no verdict, that a run's leftover processes
    forced kill(-1) on, or whose priority, policy, affinity or limits a run changed, or that grew (intact).
    What tests do to their own process (imports, module state) stays in it from run to run, as it would in
    any harness that runs several tests in one interpreter: test code is the dataset's, not the policy's."""

    def __init__(self, pid, sock, state, rss):
        self.pid, self.sock, self.state, self.rss = pid, sock, state, rss

    @classmethod
    def start(cls, server):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                os.close(server.requests)
                os.close(server.replies)
                os.close(server.pidns)
                for _, status_r, sock in server.next_inits:  # the next runs' inits are the server's to talk to
                    os.close(status_r)
                    sock.close()
                drop_capabilities()  # the server's CAP_SYS_ADMIN is for making runs' namespaces alone
                os.dup2(0, 2)  # /dev/null: what tests print is nobody's output
                _libc.prctl(PR_SET_NAME, TESTER_NAME, 0, 0, 0)
                tester_loop(theirs, server.harness)
            finally:
                _exit(1)
        theirs.close()
        return cls(pid, ours, scheduling(pid), resident_bytes(pid))

    def finished(self):
        """True once the tester has written this run's verdict; False if it died instead."""
        try:
            return self.sock.recv(16) == b"done"
        except OSError:
            return False

    def intact(self, affinity):
        """Between runs: running (a stopped tester is continued), as it started, and not grown."""
        try:
            os.kill(self.pid, signal.SIGCONT)
            return (scheduling(self.pid) == self.state and os.sched_getaffinity(self.pid) == affinity
                    and resident_bytes(self.pid) <= self.rss + TESTER_GROWTH)
        except OSError:
            return False

    def kill(self):
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def tester_loop(sock, harness):
    """The tester's life: one program test per message, until the server closes the socket."""
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 16, 4)
        if not msg:
            _exit(0)
        stdin_fd, out_w, call_w, reply_r = fds
        try:
            with open(stdin_fd, "rb", closefd=True) as f:
                request = json.loads(f.read())
            verdict = harness.judge(request, call_w, reply_r)
        finally:
            os.close(call_w)  # the solution's process reads the end of the calls: it exits
            os.close(reply_r)
        try:
            harness.write_verdict(out_w, request["nonce"], verdict)
        except OSError:
            pass  # the server stopped reading (the run was cut off): it replaces us
        os.close(out_w)
        sock.send(b"done")


def mount(source, target, fstype, flags, data=None):
    enc = lambda x: None if x is None else x.encode()  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount %s" % target)


# A /proc of the caller's PID namespace over /proc, with its processes' directories only (subset=pid): none of the
# host-wide files (stat, meminfo, loadavg, sys/, ...) through which runs could see each other.
PROC_MOUNT = (b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"subset=pid")


def mount_proc():
    if _libc.mount(*PROC_MOUNT) != 0:
        raise OSError(ctypes.get_errno(), "mount /proc")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


CAP_SYS_ADMIN_MASK = 1 << 21


def drop_bounding_set():
    """Empty the bounding set (needs CAP_SETPCAP): no process forked from here can gain a capability again."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == 22:  # EINVAL: past the kernel's last capability
                break
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP %d" % cap)


def set_capabilities(mask):
    """Effective and permitted = ``mask`` (capabilities 0-31), inheritable none (the ambient set empties)."""
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    data[0].effective = data[0].permitted = mask
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def drop_capabilities():
    """No capability left in any set (the bounding set is empty since the server's start)."""
    set_capabilities(0)


def close_all_but(keep):
    """Close every fd but those in ``keep`` (one close_range call for each gap, not one close per fd)."""
    low = 0
    for fd in sorted(set(keep)) + [resource.getrlimit(resource.RLIMIT_NOFILE)[0]]:
        if low < fd:  # never an empty range: closerange(n, n) would close from n up (close_range(n, n - 1))
            os.closerange(low, fd)
        low = fd + 1


def parent_of(pid):
    """The parent's pid of ``pid`` (a string, as /proc lists it) in our namespace; None if it is gone."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def resident_bytes(pid):
    with open("/proc/%d/statm" % pid, "rb") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


RLIMITS = tuple(getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def scheduling(pid=0):
    """This process's (or ``pid``'s) nice value, scheduling policy and rlimits. A run has our uid, so the kernel
    lets it change each of them here (setpriority, sched_setscheduler, prlimit: not dumpable does not stop
    them), and every later run would inherit the change (nice 19, SCHED_IDLE, a small stack or file limit:
    slower or failing runs for other samples). An unprivileged process cannot lower its nice value or raise a
    hard limit again, so a change is not undone here: the server reports itself unclean and is replaced."""
    limits = tuple(resource.prlimit(pid, r) for r in RLIMITS)
    return os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid), limits


def exit_code(code):
    """SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def finalize(code):
    """What interpreter shutdown does before the process ends: wait for non-daemon threads, run atexit
    hooks, flush stdio (a failed stdout flush is status 120)."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:  # as the interpreter's shutdown: only a run that imported it has threads
            threading._shutdown()
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = exit_code(e.code)
    except BaseException:  # noqa: BLE001
        pass
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001
        code = 120
    try:
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    return code


# SHM_INFO / SEM_INFO / MSG_INFO each fill a struct with, among other counts, how many segments / sets /
# queues exist in the caller's IPC namespace: shm_info.used_ids (int 0), seminfo.semusz (int 7),
# msginfo.msgpool (int 0). The buffer and the queries are made once: a run's clean-up allocates nothing.
_info = (ctypes.c_int * 64)()  # larger than any of the three structs
_SYSV_COUNTS = (
    (0, lambda: _libc.shmctl(0, 14, _info)),  # SHM_INFO
    (7, lambda: _libc.semctl(0, 0, 19, _info)),  # SEM_INFO
    (0, lambda: _libc.msgctl(0, 12, _info)),  # MSG_INFO
)


def sysv_ipc_left():
    """Whether any System V IPC object may exist in this namespace: three syscalls and no file read (a
    scan of /proc/sysvipc costs three file objects per run, and after almost every run there is none)."""
    for index, query in _SYSV_COUNTS:
        if query() < 0 or _info[index] != 0:
            return True  # a failed query counts as "maybe": the caller reads /proc/sysvipc
    return False


def remove_sysv_ipc():
    """Remove every System V shared memory segment, semaphore set and message queue of this IPC
    namespace (the sandbox's own): they outlive the processes that made them."""
    if not sysv_ipc_left():
        return True
    ok = True
    for kind, remove in (
        ("shm", lambda i: _libc.shmctl(i, IPC_RMID, None)),
        ("sem", lambda i: _libc.semctl(i, 0, IPC_RMID)),
        ("msg", lambda i: _libc.msgctl(i, IPC_RMID, None)),
    ):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit() and remove(int(fields[1])) != 0:
                ok = False
    return ok


def wipe(path, mode, atime_ns, mtime_ns):
    """Empty a scratch directory (whatever permissions the run set on what it made) and restore the
    directory's own mode, extended attributes and times (last: listing a directory updates its atime)."""
    try:
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            remove_tree(os.path.join(path, name))
        empty = not os.listdir(path)
        for attr in os.listxattr(path):
            if attr.startswith("user."):  # the only namespace an unprivileged run can write
                os.removexattr(path, attr)
        os.chmod(path, mode)
        os.utime(path, ns=(atime_ns, mtime_ns))
    except (OSError, RecursionError):
        return False
    return empty


def remove_tree(path):
    """rm -r, making directories the run locked (chmod 0) writable first."""
    try:
        os.unlink(path)
        return True
    except IsADirectoryError:
        pass
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        os.chmod(path, 0o700)  # a directory the run made unreadable or unwritable
        for name in os.listdir(path):
            remove_tree(os.path.join(path, name))
        os.rmdir(path)
        return True
    except OSError:
        return False


def main():
    # kill(-1) between runs must only ever reach a sandbox's own PID namespace: under bwrap this process is
    # pid 2 (bwrap's init is 1); anywhere else (a host, where pid 2 is the kernel's kthreadd) refuse.
    if os.getpid() != 2:
        sys.exit("_pool_server.py runs only as the first process of a fresh PID namespace (bwrap)")
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_DUMPABLE, 0) failed")
    # The server is PID 1 of a PID namespace of its own making: only over a namespace that the sandbox's user
    # namespace owns (bwrap's is not) may it return to its own after forking each run into a new one
    # (Server.fork_run: setns needs CAP_SYS_ADMIN there). This process stays as the server's parent and
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
