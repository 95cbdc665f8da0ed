"""Helpers shared by the reward tests: process listing, RSS, a peak sampler, the test assets directory."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def processes_matching(uids=(), needle: bytes | None = None) -> list[int]:
    """PIDs of live processes owned by one of ``uids`` or whose command line contains ``needle``.

    Zombies are dead (nothing runs, nothing is held but the process-table entry) and are left out: an
    orphaned sandbox init is reaped by the host's PID 1 whenever it gets to it.
    """
    found = []
    uids = {str(u) for u in uids}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            if needle is not None:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry.name))
                        continue
            if uids:
                with open(f"/proc/{entry.name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if line.split()[1] in uids:
                                found.append(int(entry.name))
                            break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Sampler:
    """Calls ``fn`` every few milliseconds on a thread and keeps the maximum (peak RSS, process counts)."""

    def __init__(self, fn, period_s: float = 0.01):
        self.fn, self.period_s = fn, period_s
        self.peak = fn()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.fn())
            time.sleep(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.fn())
