"""Run metrics: TensorBoard (tensorboardX), a JSONL file and a tqdm progress bar, written by process 0.

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


class EventFile:
    """A TensorBoard event file (TFRecord framing of tensorboardX's Event protos) written and flushed by the caller.

    `purge_step`: a resumed run's restart marker (SessionLog START at that step, as tensorboardX's purge_step
    writes), which makes TensorBoard hide the events a killed run wrote past its checkpoint."""

    def __init__(self, directory: Path, purge_step: int | None = None):
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # optional extra (metrics)
        from tensorboardX.record_writer import masked_crc32c
        from tensorboardX.summary import scalar
        self._event, self._crc, self._scalar = Event, masked_crc32c, scalar
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        with writing(self.path):
            self._file = open(self.path, "ab")
            self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
            if purge_step is not None:
                self._write(Event(wall_time=time.time(), step=purge_step,
                                  session_log=SessionLog(status=SessionLog.START)))
            self._file.flush()

    def _write(self, event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", self._crc(header)) + data + struct.pack("<I", self._crc(data)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        with writing(self.path):
            now = time.time()
            for k, v in values.items():
                self._write(self._event(wall_time=now, step=step, summary=self._scalar(k, v)))
            self._file.flush()

    def close(self) -> None:
        with writing(self.path):
            self._file.close()


class MetricsWriter:
    """`write(step, {...})` to every sink; `close()` at the end. JSONL lines are {"step": s, ...}."""

    def __init__(self, workdir: Path | str, *, total_steps: int, start_step: int = 0, progress: bool = True,
                 tensorboard: bool = True):
        self.enabled = jax.process_index() == 0
        self.path = Path(workdir) / "metrics.jsonl"
        self._tb = self._bar = self._file = None
        if not self.enabled:
            return
        Path(workdir).mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        with writing(self.path):
            self._file = open(self.path, "a")
        if tensorboard:
            self._tb = EventFile(Path(workdir) / "tb", purge_step=start_step + 1 if start_step else None)
        if progress:
            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def _truncate_after(self, step: int) -> None:
        """A resumed run rewrites history from its checkpoint on: drop lines a killed run wrote past it (a new
        file renamed over the old: a full disk leaves the old one whole)."""
        if not self.path.is_file():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        with writing(self.path):
            atomic_write_text(self.path, "".join(line + "\n" for line in keep))

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: _plain(v) for k, v in values.items()}
        with writing(self.path):
            self._file.write(json.dumps({"step": step, **clean}) + "\n")
            self._file.flush()
        if self._tb is not None:
            self._tb.scalars(step, {k: v for k, v in clean.items()
                                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)})
        if self._bar is not None and "loss" in clean:
            self._bar.n = step
            self._bar.set_postfix({k: f"{clean[k]:.4g}" for k in ("loss", "lr", "eval_loss") if k in clean},
                                  refresh=True)

    def close(self) -> None:
        if self.enabled:
            call_all([self._close_jsonl] + [s.close for s in (self._tb, self._bar) if s is not None])

    def _close_jsonl(self) -> None:
        with writing(self.path):
            self._file.close()


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return v
