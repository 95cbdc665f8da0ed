"""The host's half of the warm server's protocol (inside/pool_server.py): each message an 8-byte big-endian
length, a JSON header, then the raw payloads the header announces, on two pipes, with a deadline on every read
and write. A server that dies, stalls or replies garbage raises WorkerLost."""
from __future__ import annotations

import json
import math
import os
import select
import time

from vt.rewards.sandbox.cold import STDERR_KEEP

MAX_HEADER = 1 << 16


class WorkerLost(Exception):
    """The server died, stopped replying, or replied with something malformed."""

    def __init__(self, reason: str, timed_out: bool = False):
        super().__init__(reason)
        self.timed_out = timed_out


def send_request(fd: int, header: dict, payload: bytes, deadline: float) -> None:
    head = json.dumps(header).encode()
    _write_all(fd, len(head).to_bytes(8, "big") + head + payload, deadline)


def read_message(fd: int, deadline: float, why=lambda: "") -> dict:
    """One framed header; ``why()`` says what the server left on its stderr, should it have exited."""
    size = int.from_bytes(_read_exactly(fd, 8, deadline, why), "big")
    if size > MAX_HEADER:
        raise WorkerLost(f"reply header of {size} bytes")
    try:
        header = json.loads(_read_exactly(fd, size, deadline, why))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkerLost(f"unparseable reply header ({e})") from None
    if not isinstance(header, dict):
        raise WorkerLost("reply header is not an object")
    return header


def receive(fd: int, deadline: float, output_bytes: int, why=lambda: "") -> tuple[dict, bytes, bytes]:
    """A run's reply: its header, checked field by field, then its stdout and stderr."""
    reply = read_message(fd, deadline, why)
    ok = (
        reply.get("status") in ("exited", "timeout", "output_limit", "sandbox_error")
        and (reply.get("returncode") is None or type(reply.get("returncode")) is int)
        and type(reply.get("wall_s")) in (int, float)
        and type(reply.get("clean")) is bool
        and type(reply.get("stdout")) is int
        and 0 <= reply["stdout"] <= output_bytes + 1
        and type(reply.get("stderr")) is int
        and 0 <= reply["stderr"] <= STDERR_KEEP
    )
    if not ok:
        raise WorkerLost(f"malformed reply {str(reply)[:200]!r}")
    out = _read_exactly(fd, reply["stdout"], deadline, why)
    err = _read_exactly(fd, reply["stderr"], deadline, why)
    return reply, out, err


def _wait_fd(fd: int, events: int, deadline: float) -> bool:
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    poller = select.poll()  # no descriptor of its own to create and close, unlike epoll
    poller.register(fd, events)
    return bool(poller.poll(max(1, math.ceil(left * 1000))))


def _read_exactly(fd: int, n: int, deadline: float, why=lambda: "") -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if not _wait_fd(fd, select.POLLIN, deadline):
            raise WorkerLost("no reply in time", timed_out=True)
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            detail = why()
            raise WorkerLost("the server exited" + (f": {detail}" if detail else ""))
        buf += chunk
    return bytes(buf)


def _read_to_eof(fd: int, deadline: float, limit: int) -> bytes:
    buf = bytearray()
    while len(buf) < limit and _wait_fd(fd, select.POLLIN, deadline):
        chunk = os.read(fd, limit - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        if not _wait_fd(fd, select.POLLOUT, deadline):
            raise WorkerLost("the server stopped reading", timed_out=True)
        try:
            view = view[os.write(fd, view[: 1 << 16]) :]
        except (BrokenPipeError, OSError) as e:
            raise WorkerLost(f"request pipe closed ({e})") from None
