"""Run metrics: TensorBoard (tensorboardX), a JSONL file, a tqdm progress bar and, when `logging.wandb_project`
is set, a Weights & Biases run (vt.tracking), written by process 0. TensorBoard and W&B get the same scalars.

The train loop hands over each step's metrics as device arrays and reads them one step later (see
vt.train.sft), so the host never makes the device wait. MFU is model FLOPs per second over the peak:
model FLOPs per step = 6 * N * tokens + 12 * L * (heads * head_dim) * T * tokens (PaLM appendix B: weights,
plus attention scores and values at row length T), counting every position of the packed rows.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
from tqdm import tqdm

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


class MetricsWriter:
    """`write(step, {...})` to every sink; `close()` at the end. JSONL lines are {"step": s, ...}."""

    def __init__(self, workdir: Path | str, *, total_steps: int, start_step: int = 0, progress: bool = True,
                 tensorboard: bool = True, logging_cfg: LoggingConfig = LoggingConfig(), config: dict | None = None,
                 job_type: str = "train"):
        """`logging_cfg` opens a W&B run (resumed across restarts of the same workdir) with `config`, the run's
        resolved config, as its config."""
        self.enabled = jax.process_index() == 0
        self.path = Path(workdir) / "metrics.jsonl"
        self._tb = self._bar = self._wandb = None
        if not self.enabled:
            return
        Path(workdir).mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        self._file = open(self.path, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(str(Path(workdir) / "tb"), purge_step=start_step + 1 if start_step else None)
        self._wandb = open_wandb_run(logging_cfg, workdir, config=config or {}, job_type=job_type)
        if progress:
            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def _truncate_after(self, step: int) -> None:
        """A resumed run rewrites history from its checkpoint on: drop lines a killed run wrote past it."""
        if not self.path.is_file():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: _plain(v) for k, v in values.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        plotted = scalars(clean)
        if self._tb is not None:
            for k, v in plotted.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(plotted, step=step)
        if self._bar is not None and "loss" in clean:
            self._bar.n = step
            self._bar.set_postfix({k: f"{clean[k]:.4g}" for k in ("loss", "lr", "eval_loss") if k in clean},
                                  refresh=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._bar is not None:
            self._bar.close()


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return v
