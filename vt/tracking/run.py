"""A learner's trackers: metrics.jsonl on every process (its lines are the run's history), and on process 0
TensorBoard, W&B when configured, and the progress bar.

The train loop hands over each step's values once they are on the host (vt.train.loop reads a step's device
metrics while the device runs the next step), so no tracker makes the device wait.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from vt.tracking import CompositeTracker, LoggingConfig
from vt.tracking.jsonl import JsonlTracker
from vt.tracking.tensorboard import TensorBoardTracker
from vt.tracking.wandb import WandbTracker, open_wandb_run


class ProgressBar:
    """The console's one progress bar, showing loss, lr and eval_loss."""

    def __init__(self, total_steps: int, start_step: int = 0):
        self.bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def log(self, step: int, values: dict[str, Any]) -> None:
        if "loss" in values:
            self.bar.n = step
            self.bar.set_postfix({k: f"{values[k]:.4g}" for k in ("loss", "lr", "eval_loss") if k in values},
                                 refresh=True)

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        self.bar.close()


class RunTracker(CompositeTracker):
    """`log(step, values)` (device scalars read as Python numbers) to every tracker; `rows`: metrics.jsonl's lines.
    `logging_cfg` opens a W&B run (resumed across restarts of the same workdir) with `config`, the run's resolved
    config, as its config. `enabled`: this process writes (process 0)."""

    def __init__(self, workdir: Path | str, *, total_steps: int, start_step: int = 0, enabled: bool = True,
                 progress: bool = True, tensorboard: bool = True, logging_cfg: LoggingConfig = LoggingConfig(),
                 config: dict | None = None, job_type: str = "train"):
        workdir = Path(workdir)
        self.jsonl = JsonlTracker(workdir / "metrics.jsonl", start_step, enabled)
        trackers: list = [self.jsonl]
        if enabled:
            if tensorboard:
                trackers.append(TensorBoardTracker(workdir / "tb", start_step))
            run = open_wandb_run(logging_cfg, workdir, config=config or {}, job_type=job_type)
            if run is not None:
                trackers.append(WandbTracker(run))
            if progress:
                trackers.append(ProgressBar(total_steps, start_step))
        super().__init__(trackers)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.jsonl.rows

    def log(self, step: int, values: dict[str, Any]) -> None:
        super().log(step, {k: v.item() if hasattr(v, "item") else v for k, v in values.items()})
