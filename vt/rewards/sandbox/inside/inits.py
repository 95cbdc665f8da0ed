"""A warm run's namespaces and its init: the init is PID 1 of a new PID namespace (with a new mount and IPC
namespace), forked by the server ahead of the run; it forks the run's process (PID 2, as the harness is in a
fresh sandbox), which waits for its run; when that process ends, the init kills and reaps every other process
of its namespace and reports the run's status. Runs inside the sandbox (a part of pool_server.py); Python
stdlib only, never imports vt."""
import ctypes
import json
import os
import signal
import socket

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
    close_all_but,
    drop_capabilities,
    remove_tree,
)

_exit = os._exit
MAX_HEADER = 1 << 16  # a run's header, as the server passes it to the run's process (launch)
# Inits forked ahead (prepare): one, forked as the server replies, makes its namespaces while the host reads
# the reply and sends the next request. (One stdin run repeated, loaded box: fastest 3.4-3.8 ms with one ahead,
# 4.0-4.1 with none; two ahead were no faster, one more process competing for the CPUs.)
INITS_AHEAD = 1
MAX_RETIRING = 8  # inits of finished runs left to exit on their own before the server waits for one
RUN_INIT_NAME = b"vt-run-init"  # a run's init's comm; the run's process gets the interpreter's back
SETUP_FAILED = -1  # what a run's init reports when it could not make the run's namespaces (run_init)
SCRATCH = ("/tmp", "/dev/shm")


class Inits:
    """The server's runs' inits: those forked ahead (``ahead``: pid, status pipe, socket to the run's process)
    and those of runs that reported, still exiting (``retiring``: their namespaces' teardown waits for the
    kernel, off the runs' path), reaped later."""

    def __init__(self, run_process, config, modes):
        """``run_process``: a RunProcess; ``config``: the server's (its "tmp_bytes", "shm_bytes"); ``modes``:
        /tmp's and /dev/shm's modes, which the run's fresh ones get."""
        self.run_process = run_process
        # Our own PID namespace, to return to after each run's fork into a new one (fork_run).
        self.pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.ahead = []
        self.retiring = set()
        # A run's mounts (run_init), as mount(2) takes them, encoded once here rather than in every init.
        sizes = {"/tmp": config["tmp_bytes"], "/dev/shm": config["shm_bytes"]}
        self.run_mounts = [(None, b"/", None, MS_REC | MS_PRIVATE, None)]  # nothing it mounts reaches our view
        self.run_mounts += [(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                             b"size=%d,mode=%o" % (sizes[d], modes[d])) for d in SCRATCH]
        self.run_mounts.append(PROC_MOUNT)

    def check(self):
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

    def prepare(self):
        """Fork the next run's init ahead of its request, where fds can be passed (socket.send_fds): it makes
        the run's namespaces and forks the run's process (run_init) while we wait; that process waits for
        the run's header and fds (launch, await_run)."""
        while len(self.ahead) < INITS_AHEAD and hasattr(socket, "send_fds"):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid, status_r, status_w = self.fork_run()
            if pid == 0:
                ours.close()
                self.forget()  # the others ahead are the server's to talk to, as its protocol pipes
                close_all_but((0, 1, 2, status_w, theirs.fileno()))
                self.run_init(status_w, lambda: self.await_run(theirs))  # never returns
            theirs.close()
            self.ahead.append((pid, status_r, ours))

    def forget(self):
        """Close our ends of the inits ahead (in a process forked from the server, or when they are killed)."""
        for _, status_r, sock in self.ahead:
            os.close(status_r)
            sock.close()
        self.ahead = []

    def launch(self, request, body, fds):
        """Start a run (its header, its body and fds as RunProcess.become takes them) in the process an init
        forked ahead, or under an init forked now; (the init's pid, the read end of its status pipe)."""
        init = self.ahead.pop(0) if self.ahead else None
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
            self.run_init(status_w, lambda: self.run_process.become(request, body, fds))  # never returns
        return pid, status_r

    def await_run(self, sock):
        """The run's process forked ahead (PID 2 of its namespace, under its init): wait for the run (launch)
        and become it; exit if none comes. Never returns."""
        msg, fds, _, _ = socket.recv_fds(sock, MAX_HEADER, 3)
        sock.close()
        if not msg:
            _exit(0)  # the server is gone, or gave up this init
        request, body = json.loads(msg)
        self.run_process.become(request, body, fds)

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
