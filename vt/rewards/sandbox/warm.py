"""Warm sandboxes: one long-lived bwrap sandbox per worker slot, forking one fresh child per run.

Cold (cold.Sandbox.run), every test run starts bubblewrap and a Python interpreter and imports the
harness: tens of milliseconds before the first line of the solution runs, most of a short test's cost.
Here each slot keeps one sandbox with exactly that isolation (same bwrap arguments and layout, the slot's
own uid, rlimits, capped /tmp, /dev/shm and output) around a server (inside/pool_server.py) that has imported
the harness and forks one child per run; the host only sends a request and reads the reply.

What the pool adds to the cold path's guarantees, and how:
  - nothing of a run reaches the next one: each run starts in namespaces of its own (PID, mount with a fresh
    /tmp, /dev/shm and /proc, IPC), made by the server, so its pids, inode numbers and IPC ids start as in a
    fresh sandbox, and no process of the run outlives its init (see inside/pool_server.py); interpreter state
    (modules, globals, builtins, environment, signal handlers) lives in the run's own forked copy and dies
    with it;
  - the solution of a sample is written by the host, read-only to the sandbox, at /code/solution.py for
    that sample's runs only (``load``); the server itself never reads it;
  - memory: one cgroup per worker, sized to the run's budget plus the server's own share
    (``SERVER_MEMORY``); the run's processes are the OOM killer's first choice (oom_score_adj 1000);
  - the server and its tester are out of a run's sight (another PID namespace): no run can signal, renice,
    re-pin or limit them; should one change anyway (nice value, policy, rlimits), the server is replaced, and
    it restores its own CPU affinity;
  - a server that dies, stops or replies late or garbage: the host kills the worker's whole namespace and
    the run fails (timeout, runtime_error, memory), never passes and is never a verifier error; the next run
    gets a fresh worker. Only a worker that cannot *start* (before any candidate code ran) is a sandbox error,
    as a cold sandbox that cannot start is.

Placement, for speed (placement.py): each worker's sandbox (its server and every process of every run, all
forked from the server) runs on one CPU of its own (``claim_cpu``). A run's processes wake each other at every step
of the run and at every call a test makes to the solution, and a wake-up on the same CPU costs a fraction
of one on another (a pipe round trip between two Python processes on a 2-core VM: ~8 us on one CPU, ~60
us across two). A run may move its server (same uid); the server moves back before its next run. Each
sample's solution is written to the host's tmpfs (``scratch_base``).

bwrap's --die-with-parent fires when the *thread* that started it exits, so workers are started on the
pool's own long-lived thread, never on the short-lived threads that score a batch.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from vt.rewards.sandbox.channel import WorkerLost, _read_to_eof, read_message, receive, send_request
from vt.rewards.sandbox.cold import (
    Limits,
    RunResult,
    Sandbox,
    _child_pid,
    _clean_env,
    _launcher,
    _wait_dead,
    bwrap_argv,
    channel_arg,
    force_rmtree,
    kill_tree,
    launch_fds,
    prepare_code_dir,
    seccomp_fd,
)
from vt.rewards.sandbox.placement import _started_on, claim_cpu, scratch_base

log = logging.getLogger(__name__)

# The server and its parts (inside/), copied into each worker's /code/pool; the harness is /code/_harness.py
# (cold.prepare_code_dir).
SERVER_DIR = Path(__file__).parent / "inside"
SERVER_PARTS = ("pool_server.py", "inits.py", "run_process.py", "supervise.py", "tester.py", "framing.py", "kernel.py")
# The server's share of its worker's memory cgroup, on top of the run's budget: the warm interpreter
# (~15 MiB resident), the two bwrap processes, page tables and kernel memory of the namespace.
SERVER_MEMORY = 48 << 20
# Processes of a worker's uid besides a run's own and the two bwrap processes: the server, its parent (see
# inside/pool_server.main), its tester and the run's init. Without a memory cgroup they count against the run's
# RLIMIT_NPROC but hold none of its address-space budget (Limits.harness_json).
STANDING_PROCS = 4
REPLY_GRACE_S = 5.0  # beyond a run's wall clock: the server's kill-all, wipe (of up to tmp_bytes of files) and reply
START_TIMEOUT_S = 60.0  # bwrap + interpreter + warm imports, on a loaded machine
# The solution is written twice per sample (load, unload): on a disk file system each write is a journal
# commit (~0.2 ms of the host's time on ext4 here), on tmpfs ~0.03 ms.




class PoolWorker:
    """One slot: its uid, its code directory, its CPU (claimed at its first start, kept until it closes),
    and (while started) one warm server in one sandbox."""

    def __init__(self, sandbox: Sandbox, uid: int | None, spawn):
        self.sandbox, self.uid, self._spawn = sandbox, uid, spawn
        self.root = Path(tempfile.mkdtemp(prefix="vt-pool-", dir=scratch_base()))
        self.cpu: int | None = None
        self._cpu_lock: int | None = None
        self._cpu_claimed = False
        self.code_dir = prepare_code_dir(self.root, "")
        (self.code_dir / "pool").mkdir()
        os.chmod(self.code_dir / "pool", 0o755)
        for part in SERVER_PARTS:
            shutil.copyfile(SERVER_DIR / part, self.code_dir / "pool" / part)
            os.chmod(self.code_dir / "pool" / part, 0o644)
        self._solution, self._solution_tmp = str(self.code_dir / "solution.py"), str(self.code_dir / ".solution.tmp")
        self.proc: subprocess.Popen | None = None
        self.requests: int | None = None  # our ends of the protocol's pipes (the server's: channel_arg)
        self.replies: int | None = None
        self.key: tuple | None = None  # the sandbox-level limits this server was started with
        self.ns_init: int | None = None
        self.cgroup: Path | None = None
        self.stderr = None
        self._oom_seen = 0  # the cgroup's OOM-kill count after the last run (the host's only reader of it)
        self.lost = 0  # servers killed because of a run (or that broke): each is replaced on the next run

    # ---- per sample ------------------------------------------------------------------------------

    def load(self, source: str) -> None:
        """The sample's solution at /code/solution.py (read-only inside), replacing the last one. Paths made
        once, no pathlib: this runs twice per sample on the host's scoring threads."""
        with open(self._solution_tmp, "wb") as f:
            f.write(source.encode("utf-8", "surrogatepass"))
        os.chmod(self._solution_tmp, 0o644)
        os.replace(self._solution_tmp, self._solution)

    def unload(self) -> None:
        self.load("")

    # ---- per run ---------------------------------------------------------------------------------

    def run(self, mode: str, stdin: bytes, limits: Limits) -> RunResult:
        """One run in a forked child of the warm server (started or replaced first if needed)."""
        key = (limits.memory_bytes, limits.tmp_bytes, limits.shm_bytes)
        if self.proc is not None and (self.key != key or self.proc.poll() is not None):
            self.stop()  # other sandbox-level limits, or a server that died between runs (no run's doing)
        if self.proc is None:
            problem = self._start(limits)
            if problem is not None:
                return RunResult("sandbox_error", None, b"", problem.encode(), 0.0)
        request = {
            "mode": mode,
            "limits": limits.harness_json(with_nproc=True, memory_cgroup=self.cgroup is not None,
                                          standing=STANDING_PROCS),
            "wall_s": limits.wall_s,
            "output_bytes": limits.output_bytes,
            "stdin": len(stdin),
        }
        start = time.monotonic()
        try:
            # The server is idle and reading: a failed send means it died between runs (not this run's
            # doing: no candidate code of it ran), so it is a sandbox error if a fresh one fails too.
            send_request(self.requests, request, stdin, start + REPLY_GRACE_S + len(stdin) / (16 << 20))
        except WorkerLost as e:
            self._lose(e)
            if self._start(limits) is not None:
                return RunResult("sandbox_error", None, b"", f"sandbox server lost between runs: {e}".encode(), 0.0)
            start = time.monotonic()
            try:
                send_request(self.requests, request, stdin, start + REPLY_GRACE_S + len(stdin) / (16 << 20))
            except WorkerLost as e2:
                self._lose(e2)
                return RunResult("sandbox_error", None, b"", f"sandbox server lost: {e2}".encode(), 0.0)
        try:
            reply, out, err = receive(self.replies, start + limits.wall_s + REPLY_GRACE_S, limits.output_bytes,
                                      self._stderr_tail)
        except WorkerLost as e:
            # This run killed, stopped or starved its server (or the server broke): the run fails.
            wall = time.monotonic() - start
            oom = self._new_oom_kills()
            self._lose(e)
            if e.timed_out and not oom:
                return RunResult("timeout", None, b"", b"", wall)
            return RunResult("exited", 128 + signal.SIGKILL, b"", f"sandbox server lost: {e}".encode(), wall, oom)
        if not reply["clean"]:
            self._lose("it could not clear its namespace, or undo what the run changed in it, after a run")
        oom = self._new_oom_kills()
        return RunResult(reply["status"], reply["returncode"], out, err, reply["wall_s"], oom)

    # ---- the server's life -----------------------------------------------------------------------

    def _start(self, limits: Limits) -> str | None:
        """Start a server; None when it is ready, else why not (and nothing of it is left)."""
        sb = self.sandbox
        self.cgroup = sb.cgroups.create(limits.memory_bytes + SERVER_MEMORY) if sb.cgroups is not None else None
        self._oom_seen = 0
        self.stderr = tempfile.TemporaryFile()  # bwrap's and the server's own errors; runs have their own
        info_r, info_w = os.pipe()
        req_r, self.requests = os.pipe()
        self.replies, rep_w = os.pipe()
        seccomp = seccomp_fd()
        argv = bwrap_argv(sb.bwrap, sb.python, self.code_dir, limits.tmp_bytes, info_w, limits.shm_bytes, seccomp,
                          admin=True)
        config = {"tmp_bytes": limits.tmp_bytes, "shm_bytes": limits.shm_bytes}
        argv += [sb.python, "-I", "/code/pool/pool_server.py", channel_arg((req_r, rep_w)), json.dumps(config)]
        prefix, ids = _launcher(sb.cgroups.procs(self.cgroup) if self.cgroup is not None else [], self.uid)
        if not self._cpu_claimed:
            self._cpu_claimed = True
            self.cpu, self._cpu_lock = claim_cpu() or (None, None)
        try:
            self.proc = self._spawn(
                self.cpu,
                lambda: subprocess.Popen(
                    prefix + argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=self.stderr,
                    env=_clean_env(),
                    cwd="/",
                    start_new_session=True,
                    pass_fds=launch_fds(info_w, seccomp, req_r, rep_w),
                    close_fds=True,
                    **ids,
                )
            )
        except OSError as e:
            os.close(info_r)
            os.close(info_w)
            self.stop()
            return f"could not start bwrap: {e}"
        finally:
            for fd in (seccomp, req_r, rep_w):
                if fd is not None:
                    os.close(fd)
        os.close(info_w)
        self.key = (limits.memory_bytes, limits.tmp_bytes, limits.shm_bytes)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            self.ns_init = _child_pid(_read_to_eof(info_r, deadline, 4096))
            hello = read_message(self.replies, deadline, self._stderr_tail)
            if hello != {"ready": True}:
                raise WorkerLost(f"sent {str(hello)[:100]!r} instead of ready")
        except WorkerLost as e:
            self.stop()
            return f"sandbox server did not start ({e})"
        finally:
            os.close(info_r)
        return None

    def _lose(self, why) -> None:
        log.info("sandbox server killed, a fresh one starts on the next run: %s", why)
        self.lost += 1
        self.stop()

    def stop(self) -> None:
        """Kill the worker's whole namespace and wait until nothing of it is left."""
        if self.proc is not None:
            kill_tree(self.proc, self.ns_init)
            if self.ns_init is not None:
                _wait_dead(self.ns_init)
            self.proc = None
        for fd in (self.requests, self.replies):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.requests = self.replies = None
        self.ns_init = None
        if self.cgroup is not None:
            self.sandbox.cgroups.remove(self.cgroup)
            self.cgroup = None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    def close(self) -> None:
        self.stop()
        force_rmtree(self.root)
        if self._cpu_lock is not None:
            os.close(self._cpu_lock)  # the CPU is free for the next worker, here or in another process
            self._cpu_lock = self.cpu = None

    def _new_oom_kills(self) -> bool:
        """Whether the OOM killer killed in this worker's cgroup since the last run ended. The cgroup is
        the server's, made empty by _start, and nothing but runs allocates in it between two runs, so
        the count after one run is the count before the next: one read of memory.events per run."""
        if self.cgroup is None:
            return False
        seen, self._oom_seen = self._oom_seen, self.sandbox.cgroups.oom_kills(self.cgroup)
        return self._oom_seen > seen

    def _stderr_tail(self) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - 600))
            return self.stderr.read().decode(errors="replace").strip()
        except (OSError, AttributeError):
            return ""



TESTER_NAME = "vt-tester"  # the comm of a server's tester (inside/tester.TESTER_NAME)


def _tree(worker: PoolWorker) -> list[tuple[int, int, str]]:
    """(pid, depth, comm) of the worker's outer bwrap (depth -1) and of every process under its namespace's
    init (depth 0): the server's parent (1), the server (2), its tester and the runs' inits (3)."""
    if worker.proc is None or worker.proc.poll() is not None:
        return []
    found = [(worker.proc.pid, -1, "bwrap")]
    todo = [(worker.ns_init, 0)] if worker.ns_init is not None else []
    while todo:
        pid, depth = todo.pop()
        with contextlib.suppress(OSError):
            found.append((pid, depth, Path(f"/proc/{pid}/comm").read_text().strip()))
            todo += [(int(c), depth + 1) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return found


class SandboxPool:
    """``len(uids)`` warm workers, one per uid (two concurrent runs never share a uid); started lazily."""

    def __init__(self, sandbox: Sandbox, uids: list):
        if not sandbox.isolated:
            raise ValueError("the warm pool needs bwrap isolation; unsandboxed runs use the cold path")
        # One long-lived thread starts every bwrap (see the module docstring).
        self._spawner = cf.ThreadPoolExecutor(1, thread_name_prefix="vt-sandbox-spawn")
        self.workers = [PoolWorker(sandbox, uid, self._spawn) for uid in uids]
        self._idle: queue.Queue[PoolWorker] = queue.Queue()
        for w in self.workers:
            self._idle.put(w)
        self._closed = False
        self._lock = threading.Lock()

    def _spawn(self, cpu, start):
        return self._spawner.submit(_started_on, cpu, start).result()

    @contextlib.contextmanager
    def worker(self, source: str) -> Iterator[PoolWorker]:
        """A free worker with ``source`` loaded as the solution, for one sample's runs."""
        if self._closed:
            raise RuntimeError("sandbox pool is closed")
        w = self._idle.get()
        try:
            w.load(source)
            yield w
        finally:
            w.unload()
            self._idle.put(w)

    @property
    def replaced(self) -> int:
        """Servers killed because of a run (it killed, stopped or starved them) or because they broke."""
        return sum(w.lost for w in self.workers)

    def pids(self) -> set[int]:
        """Host PIDs of the idle workers' processes (outer bwrap, namespace init, the server's parent, the
        server, its program-test tester and the inits of finished runs still exiting): everything of the
        sandbox uids that may exist between runs."""
        return {pid for w in self.workers for pid, _, _ in _tree(w)}

    def server_pids(self) -> set[int]:
        """pids() less the runs' inits: the processes that serve run after run (a fresh server, or tester,
        is a new pid here)."""
        return {pid for w in self.workers for pid, depth, comm in _tree(w) if depth <= 2 or comm == TESTER_NAME}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for w in self.workers:
            w.close()
        self._spawner.shutdown(wait=True)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
