"""Where a run's records go: one `Tracker` interface and its backends (Levanter's tracker/ is the model).

A tracker takes a step's values, `log(step, values)` (plain numbers, strings, lists: a metrics line), a job's
results, `summary(values)` (possibly nested: {"heldout": {"math": 0.4}}), and `close()`. Backends:
  - `jsonl.JsonlTracker`: <workdir>/metrics.jsonl, every value, one line per step (always written);
  - `tensorboard.TensorBoardTracker`: <workdir>/tb/, vt's own event writer (why: its docstring);
  - `wandb.WandbTracker`: a Weights & Biases run, when `logging.wandb_project` is set (the optional extra);
  - `run.ProgressBar`: the console's progress bar.
`run.RunTracker` is a learner's set of them; `wandb.log_summary` gives an evaluation or a pipeline stage its
results. TensorBoard and W&B plot the same values (`scalars`). Only process 0 writes (the callers pass `enabled`).

This package imports no JAX: a config file's `logging` section comes from here (vt.config's boundary).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, Sequence

from vt.io import call_all
from vt.validation import FieldError

MODES = ("", "online", "offline", "disabled")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    wandb_project: str = ""  # W&B project; "" = no W&B run (TensorBoard and metrics.jsonl are always written)
    wandb_entity: str = ""  # W&B team or user ("" = the logged-in user's default)
    wandb_run_name: str = ""  # display name ("" = the work directory's name; the recipe: the stage's name)
    wandb_group: str = ""  # groups runs in the W&B UI ("" = none; the recipe: one group per pipeline work directory)
    wandb_tags: tuple[str, ...] = ()
    wandb_mode: str = ""  # online | offline | disabled ("" = the WANDB_MODE environment variable, else online)

    def __post_init__(self):
        if self.wandb_mode not in MODES:
            raise FieldError("LoggingConfig", "wandb_mode", f"{self.wandb_mode!r}: expected one of {', '.join(map(repr, MODES[1:]))}")


def logging_defaults() -> dict:
    """The `logging` section of a config file: every LoggingConfig field at its default, so that each one can
    be set with --config.logging.<field>=VALUE."""
    return dataclasses.asdict(LoggingConfig())


def scalars(values: dict[str, Any]) -> dict[str, float | int]:
    """The entries of a metrics line that are plotted: finite numbers (not bools, strings or lists). TensorBoard
    and W&B are both sent exactly these."""
    return {k: v for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, Any]) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class CompositeTracker:
    """Several trackers as one; `close` closes every one and then raises the first error (vt.io.call_all)."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def log(self, step: int, values: dict[str, Any]) -> None:
        for t in self.trackers:
            t.log(step, values)

    def summary(self, values: dict[str, Any]) -> None:
        for t in self.trackers:
            t.summary(values)

    def close(self) -> None:
        call_all([t.close for t in self.trackers])
