"""Watching one warm run, from its init (PID 1 of the run's namespaces, see inits.py): its output read as it comes,
its wall clock, its process's exit and (a program test) the tester's verdict. Runs inside the sandbox (a part of
pool_server.py); Python stdlib only, never imports vt."""
import os
import select
import signal
import time

from inits import exit_code_of, kill_and_reap

VERDICT_GRACE_S = 0.5  # after a program test's verdict: for the solution's process to end before it is killed
NO_PIDFD_POLL_MS = 5  # without a pidfd (an old kernel, or no fd left): how often the run's process is looked at


def supervise(pid, start, wall_s, out, err, out_r, err_r, tester=None):
    """Read the run's stdout and stderr (into ``out``, ``err``: framing.Output) until both are closed and its
    main part is done (its process ``pid`` has exited; with ``tester``, the tester has also written the
    verdict), or until its wall clock or stdout cap; (status, the run's exit status or None, the tester's
    verdict or None, wall seconds). When the run's process exits, every other process of the namespace is
    killed and reaped at once (as a fresh sandbox's init ends with its command); on any other way out too."""
    deadline = start + wall_s
    status, code, verdict = "exited", None, None
    tester_fd = tester.sock.fileno() if tester is not None else None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # (Python < 3.9, Linux < 5.3, or the run took our fd budget)
        pidfd = None
    poller = select.poll()
    for fd in (out_r, err_r, pidfd, tester_fd):
        if fd is not None:
            poller.register(fd, select.POLLIN)
    open_fds = {out_r, err_r}

    def main_done():
        return code is not None and (tester is None or verdict is not None)

    try:
        while open_fds or not main_done():
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            wait_ms = max(1, int(left * 1000))
            ready = poller.poll(wait_ms if pidfd is not None or code is not None else min(wait_ms, NO_PIDFD_POLL_MS))
            if pidfd is None and code is None:
                done, wait_status = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    code = exit_code_of(wait_status)
                    kill_and_reap()
            for fd, _ in ready:
                if fd == pidfd:
                    poller.unregister(pidfd)
                    code = exit_code_of(os.waitpid(pid, 0)[1])
                    kill_and_reap()  # the rest of the run goes with its process: its pipes close
                elif fd == tester_fd:
                    poller.unregister(tester_fd)
                    verdict = tester.finished()
                    if code is None:
                        # The tester closed its end of the calls: the solution's process ends, and with
                        # it the run. One that does not within the grace is killed.
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
        for fd in (out_r, err_r, pidfd):
            if fd is not None:
                os.close(fd)
    if code is None:
        kill_and_reap()
        code = 128 + signal.SIGKILL  # as a fresh sandbox's harness killed with its namespace
        if verdict is not None and status == "timeout":
            status = "exited"  # the verdict came in time; only the solution's process lingered
    return status, code, verdict, wall
