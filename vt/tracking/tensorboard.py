"""TensorBoard event files written by vt itself: the few protobuf fields scalars need, encoded here.

Why not tensorboardX's SummaryWriter: it writes from a thread that dies on a write error (a full disk), after
which its bounded queue blocks the train loop for ever, deaf to SIGTERM; and importing it imports PyTorch. Here
every write happens in the caller's thread and is flushed at once, so a full disk raises OutOfSpace (vt.io)
naming the file at the step it happens.
"""
from __future__ import annotations

import math
import socket
import struct
import time
from pathlib import Path
from typing import Any

from vt.io import writing
from vt.tracking import scalars


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf writes a negative one
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (string, bytes, sub-message)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # CRC-32C (Castagnoli), reflected
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset (the "masked" CRC of the TFRecord format)."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _event(wall_time: float, step: int = 0, *, file_version: str = "", summary: bytes = b"",
           session_start: bool = False) -> bytes:
    """A serialized tensorflow.Event (tensorboard's event.proto): wall_time = 1, step = 2, file_version = 3,
    summary = 5, session_log = 7 (SessionLog.status = 1, START = 1)."""
    out = b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if file_version:
        out += _field(3, file_version.encode())
    if summary:
        out += _field(5, summary)
    if session_start:
        out += _field(7, b"\x08\x01")
    return out


_FLOAT32_MAX = 3.4028234663852886e38


def _float32(v: float) -> bytes:
    """As float32, beyond whose range a value is infinite (as protobuf stores it; struct would refuse it)."""
    return struct.pack("<f", v if abs(v) <= _FLOAT32_MAX else math.copysign(math.inf, v))


def _scalar_summary(values: dict[str, float]) -> bytes:
    """A serialized Summary: one Value (tag = 1, simple_value = 2 as float32) per scalar."""
    return b"".join(_field(1, _field(1, tag.encode()) + b"\x15" + _float32(v)) for tag, v in values.items())


class EventFile:
    """A TensorBoard event file: TFRecords of tensorflow.Event protos, written and flushed by the caller.

    `purge_step`: a resumed run's restart marker (SessionLog START at that step), which makes TensorBoard hide
    the events a killed run wrote past its checkpoint."""

    def __init__(self, directory: Path, purge_step: int | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        with writing(self.path):
            self._file = open(self.path, "ab")
            self._write(_event(time.time(), file_version="brain.Event:2"))
            if purge_step is not None:
                self._write(_event(time.time(), purge_step, session_start=True))
            self._file.flush()

    def _write(self, event: bytes) -> None:
        header = struct.pack("<Q", len(event))
        self._file.write(header + struct.pack("<I", _masked_crc32c(header)) + event
                         + struct.pack("<I", _masked_crc32c(event)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        with writing(self.path):
            self._write(_event(time.time(), step, summary=_scalar_summary(values)))
            self._file.flush()

    def close(self) -> None:
        with writing(self.path):
            self._file.close()


class TensorBoardTracker:
    """<directory>/events.out.tfevents.*: the plotted values of each step (`vt.tracking.scalars`). A resumed
    run (`start_step` > 0) marks its restart, so TensorBoard hides what a killed run wrote past its checkpoint."""

    def __init__(self, directory: Path, start_step: int = 0):
        self.file = EventFile(directory, purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.file.scalars(step, scalars(values))

    def summary(self, values: dict[str, Any]) -> None:
        pass  # a job's results go to metrics lines and W&B; TensorBoard plots steps

    def close(self) -> None:
        self.file.close()
