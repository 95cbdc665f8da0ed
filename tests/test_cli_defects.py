"""Issue 16 regressions the fuzz test (tests/test_cli_fuzz.py) does not reach: they need a real checkpoint,
a full disk, a resumed output or a particular outcome (records written, a progress bar)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testutil import REPO, small_tmpfs
from vt import VtError
from vt.cli import main


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A small real vt checkpoint (tiny preset, random weights) and its HF export. Weights drawn with numpy
    for the abstract model's shapes: no initialiser to compile."""
    from vt.checkpoint.io import atomic_output_dir
    from vt.checkpoint.params import export_to_hf, flat_params, load_model, write_model_entries
    from vt.model.config import preset
    from vt.model.qwen2 import abstract_model
    root = tmp_path_factory.mktemp("defects")
    cfg = preset("tiny", num_layers=1, vocab_size=256)
    rng = np.random.default_rng(0)
    params = {k: rng.normal(0, 0.02, s.shape).astype(s.dtype) for k, s in flat_params(abstract_model(cfg)).items()}
    with atomic_output_dir(root / "ck") as tmp:
        write_model_entries(tmp, cfg, params)
    export_to_hf(load_model(root / "ck"), root / "hf")
    return root / "ck"


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_relative_paths_in_merge_out_and_info(ckpt, tmp_path, monkeypatch, capsys):
    # Orbax takes absolute paths only: `vt merge --out rel` and `vt info rel` crashed with a ValueError.
    monkeypatch.chdir(tmp_path)
    os.symlink(ckpt, tmp_path / "rel_ck")
    assert main(["merge", "rel_ck", "rel_ck", "--out", "merged"]) == 0
    assert main(["info", "merged"]) == 0 and main(["info", "rel_ck"]) == 0
    assert "preset" in capsys.readouterr().out


def test_checkpoint_without_params_metadata_is_named(ckpt, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "params" / "_METADATA").unlink()
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    for argv in (["info", str(broken)], ["convert", "orbax-to-hf", str(broken), str(tmp_path / "hf")],
                 ["merge", str(broken), str(ckpt), "--out", str(tmp_path / "m")],
                 ["sample", "--ckpt", str(broken), "--prompts", str(tmp_path / "p.jsonl"), "--out",
                  str(tmp_path / "o.jsonl"), "--no-progress"]):
        # Unverified (--trust-checkpoint), the reader itself names the missing metadata ...
        assert main([*argv, "--trust-checkpoint"]) == 2, argv
        assert f"{broken}/params: no parameter metadata" in one_error_line(capsys)
        # ... and verified (the default), the checkpoint's seal refuses it first, naming the missing file.
        assert main(argv) == 2, argv
        assert "_METADATA" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "p.jsonl"]


@pytest.fixture
def full_disk(tmp_path):
    """A 32 KiB tmpfs: too small for any checkpoint. Needs root (CI runs as root)."""
    with small_tmpfs(tmp_path / "full", "32k") as mnt:
        yield mnt


# Orbax's writer thread, stopped by the failure, leaves an "Event loop is closed" behind for the collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_disk_full_in_convert_and_merge_is_one_line_and_leaves_nothing(ckpt, full_disk, capsys):
    for argv in (["convert", "hf-to-orbax", str(ckpt.parent / "hf"), str(full_disk / "ck")],
                 ["convert", "orbax-to-hf", str(ckpt), str(full_disk / "hf")],
                 ["merge", str(ckpt), str(ckpt), "--out", str(full_disk / "m")]):
        assert main(argv) == 2, argv
        assert "out of disk space" in one_error_line(capsys)
        # No output appears. (Orbax's writer threads can outlive the failed save for a moment and re-create files
        # in the hidden temporary directory after it was removed; in a `vt` process they die with it.)
        assert [p.name for p in full_disk.iterdir() if not p.name.startswith(".")] == [], "a half-written output"


def test_disk_full_in_convert_and_merge_processes_prints_one_line(ckpt, full_disk):
    """The same in a `vt` process of its own, where what Orbax's threads and tensorstore's late callbacks print
    (issue 23: "Event loop is closed" tracebacks before the line) reaches the real stderr. The three run at once."""
    runs = {name: subprocess.Popen([sys.executable, "-m", "vt", *argv], cwd=REPO, text=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env={**os.environ, "JAX_PLATFORMS": "cpu"})
            for name, argv in {"convert hf-to-orbax": ["convert", "hf-to-orbax", str(ckpt.parent / "hf"),
                                                       str(full_disk / "ck")],
                               "convert orbax-to-hf": ["convert", "orbax-to-hf", str(ckpt), str(full_disk / "hf")],
                               "merge": ["merge", str(ckpt), str(ckpt), "--out", str(full_disk / "m")]}.items()}
    for name, p in runs.items():
        _, err = p.communicate(timeout=300)
        lines = [line for line in err.splitlines() if line.strip()]
        assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in err, f"vt {name}:\n{err}"
        assert lines[0].startswith(f"vt {name}: error: out of disk space"), lines[0]


def write_records(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"completion": f"the answer is \\boxed{{{i}}}", "ground_truth": str(i)})
                            + "\n" for i in range(n)))
    return path


def test_reward_batch_size_and_out_equal_to_input(tmp_path, capsys):
    # --batch-size 0 wrote an empty output and exited 0; -1 dropped the last record; --out = --input wiped it.
    inp = write_records(tmp_path / "in.jsonl", 3)
    before = inp.read_text()
    base = ["reward", "--domain", "math", "--workers", "1", "--no-progress", "--input", str(inp)]
    for bad in ("0", "-1"):
        assert main([*base, "--out", str(tmp_path / "o.jsonl"), "--batch-size", bad]) == 2
        assert "argument --batch-size: must be >= 1" in one_error_line(capsys)
    assert main([*base, "--out", str(tmp_path / "." / "in.jsonl")]) == 2
    assert "is the input (--input)" in one_error_line(capsys)
    assert inp.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert main([*base, "--out", str(tmp_path / "o.jsonl"), "--batch-size", "2"]) == 0
    scored = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["score"] for r in scored] == [1.0, 1.0, 1.0]


def test_reward_shows_a_progress_bar_unless_told_not_to(tmp_path, capsys):
    inp = write_records(tmp_path / "in.jsonl", 2)
    assert main(["reward", "--domain", "math", "--workers", "1", "--input", str(inp), "--out",
                 str(tmp_path / "o.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "vt reward: 100%" in err and "2/2" in err, err


def test_profile_resumed_with_another_k_is_refused(tmp_path):
    from vt.rl.profile import profile
    out = tmp_path / "profile.jsonl"
    out.write_text(json.dumps({"id": "a", "pass_rate": 0.5, "n": 8, "verifier_errors": 0, "k": 8}) + "\n")
    before = out.read_text()
    # Refused before the checkpoint (here: none) is touched, so mixed-k rates never reach the file.
    with pytest.raises(VtError, match=r"--k 4: .* was profiled with k=8"):
        profile(tmp_path / "no_ckpt", tmp_path / "no_tok", str(tmp_path / "no_data.jsonl"), out, k=4)
    assert out.read_text() == before


def test_config_field_ranges_are_named_by_dotted_field():
    from vt.config import to_dataclass
    from vt.datagen.quality import DedupConfig, FilterConfig
    with pytest.raises(VtError, match=r"^config\.dedup\.shingle: must be >= 1, got 0$"):
        to_dataclass(DedupConfig, {"shingle": 0}, "config.dedup")
    with pytest.raises(VtError, match=r"^config\.filter\.max_repetition: must be >= 0 and <= 1, got 1\.5$"):
        to_dataclass(FilterConfig, {"max_repetition": 1.5}, "config.filter")
    with pytest.raises(VtError, match="DedupConfig.near_threshold: must be >= 0 and <= 1"):
        DedupConfig(near_threshold=2.0)  # built in Python, not from a config file: named by class
