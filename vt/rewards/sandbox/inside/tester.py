"""The warm pool's tester: the process that runs program tests against a run's solution (see Tester). Runs inside
the sandbox (a part of pool_server.py); Python stdlib only, never imports vt."""
import json
import os
import signal
import socket

from kernel import PR_SET_NAME, _libc, drop_capabilities, resident_bytes, scheduling

_exit = os._exit
TESTER_NAME = b"vt-tester"  # the tester's /proc/PID/comm (its command line is the server's; warm.TESTER_NAME)
TESTER_GROWTH = 64 << 20  # resident bytes a tester may gain over its start before it is replaced


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
    def start(cls, harness, server_fds):
        """Fork the tester from the server; ``server_fds()``, in the tester, closes the server's own fds
        (its protocol pipes, its ends of the inits ahead)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                server_fds()
                drop_capabilities()  # the server's CAP_SYS_ADMIN is for making runs' namespaces alone
                os.dup2(0, 2)  # /dev/null: what tests print is nobody's output
                _libc.prctl(PR_SET_NAME, TESTER_NAME, 0, 0, 0)
                tester_loop(theirs, harness)
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
