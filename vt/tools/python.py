"""The `python` tool: the policy's code run as a script in vt's warm sandbox pool (vt.rewards.sandbox.warm), the
same isolation, limits and pool the code reward's tests run in; stdout comes back, then stderr's tail (a
traceback), then a note when the run timed out, ran out of memory or printed past its cap.

One pool per process, started on the first call with the first caller's worker count (`ToolsConfig.workers`), a
worker per concurrent call; it lives until the process exits. Without bwrap isolation a call is an error the
policy reads: tool code never runs unsandboxed.
"""
from __future__ import annotations

import atexit
import threading

from vt.rewards.sandbox.cold import Limits, Sandbox, SandboxUnavailable
from vt.rewards.sandbox.warm import SandboxPool
from vt.tools.registry import ToolError, string_argument, tool

OUTPUT_BYTES = 64 << 10  # stdout cap of one run: the run is stopped past it (the policy sees far less: runner caps)
_lock = threading.Lock()
_pool: SandboxPool | None = None


def sandbox_pool(workers: int) -> SandboxPool:
    """The process's pool of tool sandboxes (started on first use)."""
    global _pool
    with _lock:
        if _pool is None:
            try:
                sandbox = Sandbox(slots=workers)
            except SandboxUnavailable as e:
                raise ToolError(f"the python sandbox is unavailable: {e}") from None
            _pool = SandboxPool(sandbox, sandbox.uids or [None] * workers)
            atexit.register(_pool.close)
        return _pool


@tool("python")
def python(arguments: dict, cfg) -> str:
    code = string_argument(arguments, "code", "python")
    limits = Limits(wall_s=cfg.timeout_s, memory_bytes=cfg.memory_bytes, output_bytes=OUTPUT_BYTES)
    with sandbox_pool(cfg.workers).worker(code) as worker:
        r = worker.run("stdin", b"", limits)
    if r.status == "sandbox_error":
        raise ToolError("the python sandbox failed to start")
    parts = [r.stdout.decode("utf-8", "replace").rstrip("\n")]
    err = r.stderr_tail.decode("utf-8", "replace").rstrip("\n")
    if err:
        parts.append(err)
    if r.status == "timeout":
        parts.append(f"[timed out after {cfg.timeout_s:g} s]")
    elif r.status == "output_limit":
        parts.append(f"[stopped: printed more than {OUTPUT_BYTES} bytes]")
    elif r.oom_killed:
        parts.append(f"[killed: out of memory ({cfg.memory_bytes >> 20} MiB)]")
    out = "\n".join(p for p in parts if p)
    return out or "(no output)"
