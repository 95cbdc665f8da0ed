"""What a learner's work directory is (vt.train.loop): its layout, recognised without JAX (`vt info`)."""
from __future__ import annotations

import json
from pathlib import Path

from vt.io import LOCK_FILE

CHECKPOINTS_DIR = "checkpoints"  # a run's step directories: WORKDIR/checkpoints/<step>/


def is_run_dir(path: Path | str) -> bool:
    """Whether `path` is a learner's workdir (vt.train.loop): it has the run's checkpoints/ directory, its
    config.json (the run config, with the `learner` field a model's config.json lacks), or the lock of a run
    killed before it wrote either."""
    path = Path(path)
    if (path / CHECKPOINTS_DIR).is_dir() or (path / LOCK_FILE).is_file():
        return True
    try:
        run_config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(run_config, dict) and "learner" in run_config
