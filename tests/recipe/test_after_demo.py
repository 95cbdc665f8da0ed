"""After the demo: README's "After the demo" commands, run as written against a demo work directory (parsed from
README.md, so the README cannot drift from what works), `vt info` on the work directory, and what the console
says at the end of a run (the held-out table once, the final checkpoint, the export and its check, the eval
summaries, the plot, a viewer command).

The work directory is the demo's (configs/demo.py:ci) with the stages between sft1 and eval turned off and fewer
steps and prompts: the same data, tokenizer, checkpoints, eval and export layout as `make demo` leaves, in about
a tenth of the time."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testutil import REPO, build_once, run_vt
from vt.recipe.stages import STAGE_NAMES

KEPT = ("data", "sft1", "eval", "export")
SFT_STEPS = 60


def readme_blocks() -> list[str]:
    """The ```sh blocks of README's "After the demo" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## After the demo\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def _overrides() -> list[str]:
    flags = [f"--config.stages.{s}.enabled=False" for s in STAGE_NAMES if s not in KEPT]
    flags += [f"--config.stages.sft1.train.steps={SFT_STEPS}", f"--config.stages.sft1.checkpoint.every={SFT_STEPS}",
              "--config.probe.limit=4"]
    flags += [f"--config.stages.eval.benchmarks.demo_{d}.limit=4" for d in ("math", "code", "stem", "instruct")]
    return flags


@pytest.fixture(scope="module")
def demo(shared_dir):
    """(directory holding demo_out, the run's console output), built once a session (testutil.build_once)."""
    def run(root: Path):
        proc = subprocess.run([sys.executable, "-m", "vt", "pipeline", "--config", "configs/demo.py:ci", "--workdir",
                               str(root / "demo_out"), *_overrides()], cwd=REPO, capture_output=True, text=True,
                              timeout=1500)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        (root / "console.txt").write_text(proc.stdout + proc.stderr)
        # README's commands run from the repository root: the same names here (configs/, .venv/), demo_out the run's.
        (root / "configs").symlink_to(REPO / "configs")
        (root / ".venv").symlink_to(Path(sys.prefix))
    root = build_once("after_demo", run)
    return root, (root / "console.txt").read_text()


def test_readme_after_the_demo_commands_run_as_written(demo):
    root, _ = demo
    blocks = readme_blocks()
    assert len(blocks) >= 4 and any("vt sample" in b for b in blocks) and any("vt eval" in b for b in blocks)
    outputs = []
    for block in blocks:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=root, capture_output=True, text=True,
                              timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, f"README block failed:\n{block}\n--- stdout\n{proc.stdout[-2000:]}\n" \
                                     f"--- stderr\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    samples = [json.loads(x) for x in (root / "demo_out" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 2 and all(s["completion_ids"] for s in samples)
    summary = json.loads((root / "demo_out" / "my_eval" / "math" / "summary.json").read_text())
    assert summary["name"] == "demo_math" and summary["problems"] == 64 and "pass@4" in summary
    assert " -> " in outputs[-1]  # the transformers snippet printed its prompt and completion


def test_vt_info_on_the_work_directory_lists_stages_and_the_final_checkpoint(demo):
    root, _ = demo
    work = root / "demo_out"
    proc = run_vt("info", str(work))
    assert proc.returncode == 0, proc.stderr
    for stage in KEPT:
        assert re.search(rf"^  {stage}\s", proc.stdout, flags=re.M), proc.stdout
    final = work / "sft1" / "checkpoints" / str(SFT_STEPS)
    assert f"final checkpoint: {final}" in proc.stdout and f"Hugging Face export: {work / 'export' / 'hf'}" \
        in proc.stdout, proc.stdout
    d = json.loads(run_vt("info", str(work), "--json", check=True).stdout)
    assert [m["stage"] for m in d["stages"]] == list(KEPT) and d["final_checkpoint"] == str(final)
    assert (work / "final").resolve() == final.resolve()
    # vt reads the export back as it is (sealed over every file it holds, tokenizer included).
    assert run_vt("info", str(work / "export" / "hf")).returncode == 0
    assert run_vt("convert", "hf-to-orbax", str(work / "export" / "hf"), str(root / "back")).returncode == 0


def test_the_console_says_where_every_result_is(demo):
    root, out = demo
    work = root / "demo_out"
    assert out.count("| stage |") == 1, out  # the held-out table, once, at the end
    assert out.index("| stage |") > out.index("[pipeline] export: done")
    for stage in KEPT:
        assert f"[pipeline] {stage}: running in" in out and f"[pipeline] {stage}: done in" in out, stage
    assert "held-out mean" in out
    m = json.loads((work / "export" / "manifest.json").read_text())["metrics"]
    assert m["tokenizer_match"] == "4/4" and m["greedy_match"] == "4/4", m  # transformers as users load it
    assert re.search(r"final checkpoint .*sft1/checkpoints/" + str(SFT_STEPS), out), out[-2000:]
    assert re.search(r"Hugging Face .*export/hf .*tokenizer match 4/4, greedy match 4/4", out), out[-2000:]
    for d in ("math", "code", "stem", "instruct"):
        assert re.search(rf"eval demo_{d} .*pass@1 \d", out), out[-2000:]
    assert "plot.png" in out and re.search(r"TensorBoard .*tensorboard.* --logdir ", out), out[-2000:]
    assert "Loading weights" not in out  # transformers' loading bar stays out of the demo's console


def test_until_data_prints_no_malformed_table(tmp_path):
    proc = run_vt("demo", "--variant", "ci", "--workdir", str(tmp_path / "w"), "--until", "data")
    assert proc.returncode == 0, proc.stderr
    assert "| stage |" not in proc.stdout and "no stage that trains a model has finished yet" in proc.stdout
    assert (tmp_path / "w" / "data" / "tokenizer" / "tokenizer.json").is_file()


@pytest.mark.parametrize("name", ["demo_walkthrough", "conversion_round_trip"])
def test_notebooks_run_top_to_bottom(demo, name, monkeypatch):
    """notebooks/ execute, every cell, on the tiny model (against the small demo work directory), so they cannot
    rot; the walkthrough takes README's after-the-demo steps."""
    import nbclient  # the test extra installs it and ipykernel
    import nbformat
    root, _ = demo
    monkeypatch.setenv("VT_DEMO_WORKDIR", str(root / "demo_out"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    if name == "demo_walkthrough":
        assert "final checkpoint:" in text and "| stage |" in text and images >= 2, text[-3000:]
        assert "ended the turn:" in text and "finish_reason" not in text and "demo_math" in text
    else:
        assert "same chat ids as vt: True" in text and "same: True" in text and "all equal: True" in text, text


def test_vt_info_names_an_interrupted_stage_and_no_other_directory(tmp_path):
    """A stage the run planned whose directory has files but no manifest is unfinished (a re-run resumes it); a
    directory the user made in the work directory is not a stage."""
    work = tmp_path / "w"
    (work / "data").mkdir(parents=True)
    (work / "data" / "manifest.json").write_text(json.dumps({"stage": "data", "wall_s": 1.0, "checkpoint": None,
                                                             "finished": "2026-01-01T00:00:00"}))
    (work / "pipeline.json").write_text(json.dumps({"name": "demo", "stages": ["data", "sft1", "export"]}))
    for d in ("sft1", "my_eval"):
        (work / d).mkdir()
        (work / d / "metrics.jsonl").write_text("{}\n")
    proc = run_vt("info", str(work))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^  sft1\s+not finished", proc.stdout, flags=re.M) and "my_eval" not in proc.stdout
    assert "final checkpoint: none yet" in proc.stdout
