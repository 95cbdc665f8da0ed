"""<workdir>/metrics.jsonl: one line per step, {"step": s, ...every value}, flushed at once (a full disk raises
OutOfSpace naming the file at that step: vt.io.writing)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vt.io import atomic_write_text, writing


class JsonlTracker:
    """`rows` holds the run's lines so far on every process (a learner's TrainResult.history): a resumed run's,
    those of metrics.jsonl up to `start_step`, then its own. Only with `enabled` (process 0) is the file written;
    a resumed run rewrites it without the lines a killed run wrote past its checkpoint."""

    def __init__(self, path: Path, start_step: int = 0, enabled: bool = True):
        self.path, self.enabled, self._file = path, enabled, None
        kept = self._lines_through(start_step)
        self.rows: list[dict[str, Any]] = [row for _, row in kept]
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with writing(path):
            if path.is_file():
                atomic_write_text(path, "".join(line + "\n" for line, _ in kept))
            self._file = open(path, "a")

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

    def log(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": step, **values}
        self.rows.append(row)
        if self._file is not None:
            with writing(self.path):
                self._file.write(json.dumps(row) + "\n")
                self._file.flush()

    def summary(self, values: dict[str, Any]) -> None:
        pass  # the run's lines are its record; a job's results are the caller's to write

    def close(self) -> None:
        if self._file is not None:
            with writing(self.path):
                self._file.close()
