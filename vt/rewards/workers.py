"""Killable verifier processes with a hard wall-clock deadline per request.

math-verify's own timeouts are SIGALRM-based: they only work in a process's main thread and cannot
interrupt C code (a huge integer power in sympy holds the GIL until done). So each verification runs
in a separate, persistent worker process (``python -m <module>``, started with subprocess: never a fork
of a trainer that has JAX initialised), and the host side waits on the reply with a deadline. A worker
that misses its deadline, dies or answers garbage is SIGKILLed and replaced; the item becomes a
verifier error. Callers may be any thread: waiting is a ``select`` on a pipe.

Protocol: one JSON object per line each way. The worker's first line is ``{"ready": true}``, sent once
its imports are done, so slow start-up (sympy, antlr) never eats into a request's deadline.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# A reply is a few hundred bytes; anything bigger means the worker is broken.
MAX_REPLY_BYTES = 1 << 20


class WorkerError(Exception):
    """The worker missed its deadline, died, or replied with something unparseable. ``kind`` says which:
    "deadline" (a request's), "died" (exited or closed its pipe), "startup" (never became ready) or "garbage"
    (a reply that is not one JSON object per line): a caller tells the answer's doing from the verifier's by it."""

    def __init__(self, message: str, kind: str = "garbage"):
        super().__init__(message)
        self.kind = kind


class _Worker:
    def __init__(self, module: str, startup_timeout_s: float, args: tuple[str, ...] = ()):
        self.module = module
        self.startup_timeout_s = startup_timeout_s
        # stderr goes nowhere: math-verify logs every timeout and parse failure, and a hostile input can
        # make it log a lot. The worker reports failures in its replies, clipped.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_worker_env(),
            start_new_session=True,  # a Ctrl-C aimed at the trainer's terminal group is the trainer's to handle
            close_fds=True,
        )
        self._buf = b""
        self.ready = False

    def request(self, payload: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        if not self.ready:
            try:
                hello = self._read_line(time.monotonic() + self.startup_timeout_s, "startup")
            except WorkerError as e:  # died or missed: either way it never started
                raise WorkerError(str(e), "startup") from e
            if not hello.get("ready"):
                raise WorkerError(f"worker sent {hello!r} instead of ready", "startup")
            self.ready = True
        try:
            self.proc.stdin.write(json.dumps(payload).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"worker pipe closed: {e}", "died") from e
        return self._read_line(time.monotonic() + deadline_s, "deadline")

    def _read_line(self, deadline: float, what: str) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise WorkerError(f"worker missed its {what} ({self.module})", what)
                chunk = os.read(fd, 65536)
                if not chunk:
                    try:
                        code = self.proc.wait(timeout=1)
                    except subprocess.TimeoutExpired:
                        code = None
                    raise WorkerError(f"worker exited with code {code}", "died")
                self._buf += chunk
                if len(self._buf) > MAX_REPLY_BYTES:
                    raise WorkerError("worker reply exceeds 1 MiB")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkerError(f"unparseable worker reply: {line[:100]!r}") from e
        if not isinstance(reply, dict):
            raise WorkerError(f"worker reply is not an object: {line[:100]!r}")
        return reply

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def stop(self) -> None:
        """Polite shutdown: EOF on stdin ends the worker's loop; kill if it does not go."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # The worker must never grab an accelerator or spawn a thread pool per core on a shared host.
    for k in list(env):
        if k.startswith(("JAX_", "XLA_", "TPU_", "CUDA_VISIBLE")):
            env.pop(k)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


class WorkerPool:
    """``size`` persistent worker processes running ``python -m module``; thread-safe ``call``.

    Workers start lazily on first use. ``call`` blocks until a worker is free, so at most ``size``
    requests run at once: the pool is the concurrency bound.
    """

    def __init__(self, module: str, size: int, startup_timeout_s: float = 120.0, args: list[str] | None = None):
        if size < 1:
            raise ValueError(f"worker pool size must be >= 1, got {size}")
        self.module = module
        self.args = tuple(args or ())
        self.size = size
        self.startup_timeout_s = startup_timeout_s
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(size):
            self._idle.put(None)  # a free slot without a started process yet
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._closed = False
        self.replaced = 0  # workers killed and replaced (deadline, crash); a health metric

    def call(self, payload: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """Send one request; raise WorkerError (after killing the worker) if no good reply in time."""
        if self._closed:
            raise RuntimeError("worker pool is closed")
        worker = self._idle.get()
        try:
            if worker is None:
                worker = _Worker(self.module, self.startup_timeout_s, self.args)
                with self._lock:
                    self._all.add(worker)
            return worker.request(payload, deadline_s)
        except WorkerError:
            if worker is not None:
                worker.kill()
                with self._lock:
                    self._all.discard(worker)
                    self.replaced += 1
            worker = None  # the slot gets a fresh process on next use
            raise
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = list(self._all), set()
        for w in workers:
            w.stop()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
