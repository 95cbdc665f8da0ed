"""Run metrics: TensorBoard (tensorboardX), a JSONL file, a tqdm progress bar and, when `logging.wandb_project`
is set, a Weights & Biases run (vt.tracking), written by process 0. TensorBoard and W&B get the same scalars.

The train loop hands over each step's metrics as device arrays and reads them one step later (see
vt.train.sft), so the host never makes the device wait. Every write happens in the caller's thread and is flushed
at once, so a full disk raises OutOfSpace (vt.io) naming the file at the step it happens (tensorboardX's own
SummaryWriter writes from a thread that dies on the error, after which its bounded queue blocks the loop for ever). MFU is model FLOPs per second over the peak:
model FLOPs per step = 6 * N * tokens + 12 * L * (heads * head_dim) * T * tokens (PaLM appendix B: weights,
plus attention scores and values at row length T), counting every position of the packed rows.
"""
from __future__ import annotations

import json
import math
import socket
import struct
import time
from pathlib import Path
from typing import Any

import jax
from tqdm import tqdm

from vt.io import atomic_write_text, call_all, writing
from vt.model.config import ModelConfig, param_count
from vt.tracking import LoggingConfig, open_wandb_run, scalars

# Dense bf16 peak FLOP/s per device, by substring of jax's device_kind. Unknown kinds report no MFU unless
# `peak_flops` is configured.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12,
              "TPU v5e": 197e12, "TPU v4": 275e12, "TPU v6": 918e12}


def peak_flops_per_device(configured: float = 0.0) -> float | None:
    if configured > 0:
        return configured
    kind = jax.devices()[0].device_kind
    for name, flops in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return None


def model_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    return 6.0 * param_count(cfg) + 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len


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
    """A TensorBoard event file: TFRecords of tensorflow.Event protos, encoded here (the few fields scalars need)
    and written and flushed by the caller, so a write error is raised where the loop sees it. (tensorboardX's
    SummaryWriter writes from a thread that dies on the error, and importing it imports PyTorch.)

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


class MetricsWriter:
    """`write(step, {...})` to every sink; `close()` at the end. JSONL lines are {"step": s, ...}; `rows` holds
    the run's lines so far (a resumed run's: those of metrics.jsonl it keeps, then its own)."""

    def __init__(self, workdir: Path | str, *, total_steps: int, start_step: int = 0, progress: bool = True,
                 tensorboard: bool = True, logging_cfg: LoggingConfig = LoggingConfig(), config: dict | None = None,
                 job_type: str = "train"):
        """`logging_cfg` opens a W&B run (resumed across restarts of the same workdir) with `config`, the run's
        resolved config, as its config."""
        self.enabled = jax.process_index() == 0
        self.path = Path(workdir) / "metrics.jsonl"
        self._tb = self._bar = self._file = self._wandb = None
        kept = self._lines_through(start_step)  # every process: a learner's TrainResult.history holds them
        self.rows: list[dict[str, Any]] = [row for _, row in kept]
        if not self.enabled:
            return
        Path(workdir).mkdir(parents=True, exist_ok=True)
        if self.path.is_file():  # a resumed run rewrites history from its checkpoint on
            with writing(self.path):
                atomic_write_text(self.path, "".join(line + "\n" for line, _ in kept))
        with writing(self.path):
            self._file = open(self.path, "a")
        if tensorboard:
            self._tb = EventFile(Path(workdir) / "tb", purge_step=start_step + 1 if start_step else None)
        self._wandb = open_wandb_run(logging_cfg, workdir, config=config or {}, job_type=job_type)
        if progress:
            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def _lines_through(self, step: int) -> list[tuple[str, dict[str, Any]]]:
        """(line, row) of metrics.jsonl up to `step`: not the lines a killed run wrote past it, nor a line it did
        not finish (a new file renamed over the old: a full disk leaves the old one whole)."""
        kept = []
        for line in self.path.read_text().splitlines() if self.path.is_file() else []:
            try:
                row = json.loads(line)
            except ValueError:  # the end of a line a kill or a full disk cut short
                continue
            if row.get("step", 0) <= step:
                kept.append((line, row))
        return kept

    def write(self, step: int, values: dict[str, Any]) -> None:
        clean = {k: _plain(v) for k, v in values.items()}
        self.rows.append({"step": step, **clean})
        if not self.enabled:
            return
        with writing(self.path):
            self._file.write(json.dumps({"step": step, **clean}) + "\n")
            self._file.flush()
        plotted = scalars(clean)
        if self._tb is not None:
            self._tb.scalars(step, plotted)
        if self._wandb is not None:
            self._wandb.log(plotted, step=step)
        if self._bar is not None and "loss" in clean:
            self._bar.n = step
            self._bar.set_postfix({k: f"{clean[k]:.4g}" for k in ("loss", "lr", "eval_loss") if k in clean},
                                  refresh=True)

    def close(self) -> None:
        if self.enabled:
            call_all([self._close_jsonl] + [s.close for s in (self._tb, self._bar) if s is not None]
                     + ([self._wandb.finish] if self._wandb is not None else []))

    def _close_jsonl(self) -> None:
        with writing(self.path):
            self._file.close()


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return v
