"""A warm run's process: what becomes, in a forked copy of the warm server, exactly what ``python3 -I
/code/_harness.py LIMITS MODE`` would be in a fresh sandbox. Runs inside the sandbox (a part of pool_server.py);
Python stdlib only, never imports vt."""
import atexit
import json
import os
import resource
import signal
import sys

from kernel import PR_SET_DUMPABLE, PR_SET_NAME, _libc, close_all_but

_exit = os._exit  # a run may rebind os._exit in its own copy of the interpreter; it must still end here


class RunProcess:
    """What a run's process does, given the run's header, its body and fds (``become``): the harness on the
    run's stdio, or a program test's solution served to the tester."""

    def __init__(self, harness, harness_path, comm, umask):
        self.harness, self.harness_path = harness, harness_path
        self.comm, self.umask = comm, umask  # the interpreter's name and umask, as a fresh one has them

    def become(self, request, body, fds, shared):
        """Become the run ("solution": a program test's solution, served to the tester, fds: stderr, calls,
        replies; "harness": the harness on the run's stdio, fds: stdin, stdout, stderr); never returns.
        ``shared``: the server's output buffers (framing.Output), shared mappings this process inherited from
        its init: unmapped first, before any of the run's code could write a forged output into them."""
        try:
            for buffer in shared:
                buffer.close()
        except BaseException:  # noqa: BLE001
            _exit(125)
        if body == "solution":
            err_w, call_r, reply_w = fds
            self.child(os.open(os.devnull, os.O_RDONLY), err_w, err_w, request,
                       lambda: self.serve_solution(request, call_r, reply_w), keep=(call_r, reply_w))
        stdin_fd, out_w, err_w = fds
        self.child(stdin_fd, out_w, err_w, request, self.harness.main)

    def serve_solution(self, request, call_r, reply_w):
        """The solution's process of a program test: the run's limits, then the harness's serve_solution;
        never returns."""
        self.harness.set_limits(json.loads(request["limits"]))
        self.harness.serve_solution(call_r, reply_w)

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
            sys.argv = [self.harness_path, request["limits"], request["mode"]]
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
