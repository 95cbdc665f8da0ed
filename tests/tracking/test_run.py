"""vt.tracking's run records: metrics.jsonl and TensorBoard written by the caller, read back (TensorBoard with
tensorboardX's own protos and CRC), a resumed run's history cut at its checkpoint, and a full disk under each
sink named (the disks are small tmpfs mounts: real ENOSPC from the kernel; root only)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from testutil import fill_disk, small_tmpfs
from vt.io import OutOfSpace
from vt.tracking.run import RunTracker
from vt.tracking.tensorboard import EventFile


def _events(path: Path) -> list:
    """Parse a TensorBoard event file with tensorboardX's protos and CRC, checking each record's framing."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked_crc32c(header)
        body = data[i + 12:i + 12 + n]
        assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked_crc32c(body)
        event = Event()
        event.ParseFromString(body)
        out.append(event)
        i += 16 + n
    return out


def test_metrics_are_written_by_the_caller_and_read_back(tmp_path):
    w = RunTracker(tmp_path, total_steps=3, start_step=0, progress=False)
    for step in (1, 2):
        w.log(step, {"loss": 1.0 / step, "lr": 0.5, "skipped": float("nan"), "note": "x"})
    w.close()
    # a resumed run from step 1: history past it dropped, TensorBoard told to hide what the killed run wrote
    w = RunTracker(tmp_path, total_steps=3, start_step=1, progress=False)
    w.log(2, {"loss": 0.25, "grad_norm": 1e300, "tokens": 7, "é/x": -2.5})
    w.close()
    assert [json.loads(x)["loss"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1.0, 0.25]
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.1}\n{"step": 4, "lo')  # the end of a line a full disk cut short
    RunTracker(tmp_path, total_steps=5, start_step=3, progress=False, tensorboard=False).close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    # (one file per writer, or one appended to twice when both started in the same second)
    events = [e for f in sorted((tmp_path / "tb").iterdir()) for e in _events(f)]

    def what(e):
        if e.file_version:
            return [e.file_version]
        if e.HasField("session_log"):
            return [(e.step, "START" if e.session_log.status == e.session_log.START else e.session_log.status)]
        return [(e.step, v.tag, v.simple_value) for v in e.summary.value]
    assert [x for e in events for x in what(e)] == [
        "brain.Event:2", (1, "loss", 1.0), (1, "lr", 0.5), (2, "loss", 0.5), (2, "lr", 0.5),
        "brain.Event:2", (2, "START"), (2, "loss", 0.25), (2, "grad_norm", float("inf")), (2, "tokens", 7.0),
        (2, "é/x", -2.5)]  # the restart marker: TensorBoard hides steps >= 2 before it


def test_full_disk_under_each_metrics_sink_is_named(tmp_path):
    with small_tmpfs(tmp_path / "d", "64k") as d:
        w = RunTracker(d / "run", total_steps=10, progress=False, tensorboard=False)
        fill_disk(d)
        with pytest.raises(OutOfSpace, match=f"cannot write {d}/run/metrics.jsonl "):
            for step in range(10_000):  # the file's last page may still take a few lines
                w.log(step, {"loss": 1.0, "text": "x" * 200})
        with pytest.raises(OutOfSpace):
            w.close()  # what was buffered cannot be written either: said, not hidden
        (d / "filler").unlink()
        tb = EventFile(d / "tb")
        fill_disk(d)
        with pytest.raises(OutOfSpace, match=f"cannot write {tb.path} "):
            for step in range(10_000):
                tb.scalars(step, {f"metric_{i}": 1.0 for i in range(20)})
