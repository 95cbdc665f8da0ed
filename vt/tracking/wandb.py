"""Weights & Biases runs beside TensorBoard (the optional extra `wandb`), for the learners, `vt eval` and the recipe.

A run is opened by process 0 only, when the config's `logging.wandb_project` is set:

    run = open_wandb_run(cfg.logging, workdir, config=dataclasses.asdict(cfg), job_type="sft")
    tracker = WandbTracker(run); tracker.log(step, {...}); tracker.close()

Its id is kept in `<workdir>/wandb_run_id`, written before the run starts, so a restarted job (a preempted
learner, a re-run pipeline stage) continues the same W&B run instead of starting a second one. W&B writes its
files under `<workdir>/wandb/`; WANDB_MODE=offline (or `logging.wandb_mode='offline'`) needs no network, and
`wandb sync <workdir>/wandb/offline-run-*` uploads such a run later.

A resumed run cannot rewind: W&B keeps the first value it was sent for a step, so steps that a killed learner
logged after its last checkpoint keep the killed run's values there (TensorBoard's purge_step and metrics.jsonl
drop them: vt.tracking.tensorboard, vt.tracking.jsonl).
"""
from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from vt import VtError
from vt.io import atomic_write_text
from vt.tracking import LoggingConfig, scalars

log = logging.getLogger(__name__)
RUN_ID_FILE = "wandb_run_id"


def open_wandb_run(cfg: LoggingConfig, workdir: Path | str, *, config: dict, job_type: str, name: str = "",
                   enabled: bool = True):
    """A W&B run for `workdir` (resumed when the work directory already holds one), or None when W&B is off
    (`logging.wandb_project` empty) or `enabled` is False (not process 0)."""
    if not cfg.wandb_project or not enabled:
        return None
    try:
        import wandb
    except ImportError:
        raise VtError("config logging.wandb_project is set but wandb is not installed "
                      "(pip install 'vt[wandb]', or leave logging.wandb_project empty)") from None
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    id_file = workdir / RUN_ID_FILE
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:
        run_id = secrets.token_hex(6)  # W&B ids: letters and digits, unique per project
        atomic_write_text(id_file, run_id + "\n")  # before the run starts: a crash in between still resumes it
    try:
        run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity or None,
                         name=cfg.wandb_run_name or name or workdir.name, group=cfg.wandb_group or None,
                         tags=list(cfg.wandb_tags) or None, job_type=job_type, config=config, id=run_id,
                         resume="allow", dir=str(workdir), mode=cfg.wandb_mode or None,  # None: WANDB_MODE, else online
                         # vt's console (one progress bar, one summary line) stays as it is: W&B neither wraps
                         # stdout/stderr nor prints its banner; the one line below says where the run is.
                         settings=wandb.Settings(console="off", silent=True))
    except wandb.errors.Error as e:  # no API key, no network in online mode, a bad entity: one line
        raise VtError(f"W&B run for {workdir} could not start ({str(e).splitlines()[0][:300]}); "
                      "WANDB_MODE=offline logs without a network") from None
    log.info("W&B run %s: %s", run.id, f"offline, in {run.dir} (upload with `wandb sync`)" if run.offline else run.url)
    return run


def flat_scalars(values: dict[str, Any], prefix: str = "") -> dict[str, float | int]:
    """Nested summaries ({"heldout": {"math": 0.4}}) as W&B keys ("heldout/math"), plotted numbers only."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(flat_scalars(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return scalars(out)


class WandbTracker:
    """An open W&B run as a tracker: the plotted values of each step, a job's results as the run's summary."""

    def __init__(self, run):
        self.run = run

    def log(self, step: int, values: dict[str, Any]) -> None:
        self.run.log(scalars(values), step=step)

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(flat_scalars(values))

    def close(self) -> None:
        self.run.finish()


def log_summary(cfg: LoggingConfig, workdir: Path | str, summary: dict[str, Any], *, config: dict, job_type: str,
                name: str = "") -> None:
    """One job's results (an evaluation's summary, a pipeline stage's metrics) as the summary of the work
    directory's W&B run (the learner's own run when one trained there); nothing when W&B is off."""
    run = open_wandb_run(cfg, workdir, config=config, job_type=job_type, name=name)
    if run is None:
        return
    tracker = WandbTracker(run)
    try:
        tracker.summary(summary)
    finally:
        tracker.close()
