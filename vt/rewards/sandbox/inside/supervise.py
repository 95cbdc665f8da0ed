"""Watching one warm run: its output read as it comes, its wall clock, its init's report and (a program test)
the tester's verdict. Runs inside the sandbox (a part of pool_server.py); Python stdlib only, never imports
vt."""
import os
import select
import signal
import time

VERDICT_GRACE_S = 0.5  # after a program test's verdict: for the solution's process to end before it is killed


def supervise(inits, pid, status_r, start, wall_s, out, err, out_r, err_r, tester=None):
    """Read the run's stdout and stderr (into ``out``, ``err``: framing.Output) until both are closed and its
    main part is done (its init has reported the run's status, see Inits.run_init; with ``tester``, the tester
    has also written the verdict), or until its wall clock or stdout cap; (status, the run's exit status or
    None, the tester's verdict or None, wall seconds). An init that reported is done with the run (every
    process of it is dead and reaped): it is left to finish exiting (its namespaces' teardown waits for the
    kernel) while the server replies, and reaped later (Inits.retiring). Any other way out kills it and
    waits."""
    deadline = start + wall_s
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
                    code = inits.reported(pid, status_r)
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
            code = inits.exit_code_of(os.waitpid(pid, 0)[1])
        except (ProcessLookupError, ChildProcessError):
            pass
        if verdict is not None and status == "timeout":
            status = "exited"  # the verdict came in time; only the solution's process lingered
    return status, code, verdict, wall
