"""`vt eval` on several processes (launch/local.sh, 2 processes x 2 CPU devices): each process generates and
scores every 2nd chunk of problems with its own sampler on its own devices, into its own results file, and
process 0 writes the summary once both are done. A chunk's samples depend only on (seed, chunk, problem,
sample), so the results must equal a 1-process run's exactly, and a 2-process output directory must resume on
1 process (the other way round is the same code path: every results file is read on open)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from test_multiprocess import TIMEOUT, _env, _local, _run

EVAL = ["--config", "configs/eval_aime25.py:smoke", "--config.limit=6", "--config.chunk_problems=2"]


def _eval_one(out: Path, what: str):
    return _run(["timeout", "-k", "10", TIMEOUT, sys.executable, "-m", "vt", "eval", *EVAL, "--out", out],
                _env(2), what)


def _results(out: Path) -> dict[str, dict]:
    rows = {}
    for path in sorted(out.glob("results*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert row["id"] not in rows, f"{row['id']} written twice"
            rows[row["id"]] = row
    return rows


def test_eval_on_two_processes_like_one(tmp_path):
    _local([sys.executable, "-m", "vt", "eval", *EVAL, "--out", tmp_path / "two"],
           "2 processes x 2 devices: vt eval", tmp_path / "logs")
    _eval_one(tmp_path / "one", "1 process: vt eval")
    one, two = _results(tmp_path / "one"), _results(tmp_path / "two")
    assert len(one) == 6 and one == two
    # Chunks 0 and 2 (problems 0, 1, 4, 5) on process 0, chunk 1 on process 1.
    by_file = {p.name: sorted(json.loads(x)["index"] for x in p.read_text().splitlines())
               for p in (tmp_path / "two").glob("results.process-*.jsonl")}
    assert by_file == {"results.process-0.jsonl": [0, 1, 4, 5], "results.process-1.jsonl": [2, 3]}
    summary = lambda d: json.loads((tmp_path / d / "summary.json").read_text())  # noqa: E731
    assert summary("one") == summary("two") and summary("two")["problems"] == 6

    # Process 1 "killed" before writing anything: one process finishes its chunk, results as before.
    shutil.copytree(tmp_path / "two", tmp_path / "resumed")
    (tmp_path / "resumed" / "results.process-1.jsonl").unlink()
    (tmp_path / "resumed" / "summary.json").unlink()
    _eval_one(tmp_path / "resumed", "1 process: resume a 2-process vt eval")
    assert _results(tmp_path / "resumed") == one
    assert sorted(json.loads(x)["index"] for x in (tmp_path / "resumed" / "results.jsonl").read_text().splitlines()) \
        == [2, 3]
    assert summary("resumed") == summary("one")
