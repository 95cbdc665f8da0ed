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
    for argv in (["info", str(broken)], ["convert", "orbax-to-hf", str(broken), str(tmp_path / "hf"), "--no-tokenizer"],
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
                 ["convert", "orbax-to-hf", str(ckpt), str(full_disk / "hf"), "--no-tokenizer"],
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
                               "convert orbax-to-hf": ["convert", "orbax-to-hf", str(ckpt), str(full_disk / "hf"), "--no-tokenizer"],
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
    from vt.sampling.config import SamplerConfig
    out = tmp_path / "profile.jsonl"
    out.write_text(json.dumps({"id": "a", "pass_rate": 0.5, "n": 8, "verifier_errors": 0, "k": 8}) + "\n")
    before = out.read_text()
    # Refused before the checkpoint (here: none) is touched, so mixed-k rates never reach the file.
    with pytest.raises(VtError, match=r"--k 4: .* was profiled with k=8"):
        profile(tmp_path / "no_ckpt", tmp_path / "no_tok", str(tmp_path / "no_data.jsonl"), out, SamplerConfig(), k=4)
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


# --- issue 23 items 3-5, 7, 8 --------------------------------------------------------------------------------------

SMOKE_TRAIN = ["train", "--config", "configs/sft_stage1.py:smoke", "--config.train.progress=False"]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_trains_on_one_workdir_the_second_is_refused_naming_the_first(tmp_path):
    """Both ran: metrics.jsonl lost, duplicated and reordered lines and both Orbax managers deleted steps."""
    import signal
    import sys
    import time
    from testutil import REPO
    work = tmp_path / "w"
    argv = [sys.executable, "-m", "vt", *SMOKE_TRAIN, "--workdir", str(work), "--config.train.steps=100000",
            "--config.checkpoint.every=100000", "--config.train.eval_every=0"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    first = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = work / "metrics.jsonl"
        end = time.time() + 300
        while first.poll() is None and time.time() < end and not (metrics.is_file() and metrics.read_text()):
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()[1]
        second = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert second.returncode == 2 and len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"in use by another vt process (pid {first.pid}," in lines[0] and str(work) in lines[0]
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=300)
    assert first.returncode == 143, err  # the first one ran on unharmed and saved on SIGTERM
    steps = [json.loads(line)["step"] for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))
    assert (work / "checkpoints" / str(steps[-1]) / "vt_checksums.json").is_file()
    assert not (work / ".vt.lock").exists()


def test_train_into_a_model_checkpoint_or_a_foreign_tree_is_refused_before_writing(ckpt, tmp_path, capsys):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine\n")
    cases = {ckpt: "is a model checkpoint", ckpt.parent / "hf": "is a model checkpoint",
             foreign: "is not empty and not a vt training workdir"}
    for workdir, needle in cases.items():
        before = snapshot(workdir)
        assert main([*SMOKE_TRAIN, "--workdir", str(workdir)]) == 2, workdir
        line = one_error_line(capsys)
        assert f"--workdir {workdir}: {needle}" in line, line
        assert snapshot(workdir) == before
    from vt.checkpoint.seal import verify_seal
    verify_seal(ckpt, "ckpt")  # still whole


def test_checkpoint_every_zero_or_negative_is_refused_before_anything_is_written(tmp_path, capsys):
    """every=0 crashed with ZeroDivisionError after training and left a half-made workdir; every=-3 saved 3, 4."""
    for value in ("0", "-3"):
        assert main([*SMOKE_TRAIN, "--workdir", str(tmp_path / "w"), f"--config.checkpoint.every={value}"]) == 2
        assert f"config.checkpoint.every: must be >= 1, got {value}" in one_error_line(capsys)
    assert main([*SMOKE_TRAIN, "--workdir", str(tmp_path / "w"), "--config.train.eval_every=-1"]) == 2
    assert "config.train.eval_every: must be >= 0, got -1" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_every_output_is_locked_while_a_command_writes_it(ckpt, tmp_path, capsys):
    """convert, merge, sample and eval: a second writer of the same output is refused naming the first's pid."""
    from vt.io import exclusive
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    cases = [
        (tmp_path / "m", False, ["merge", str(ckpt), str(ckpt), "--out", str(tmp_path / "m")]),
        (tmp_path / "c", False, ["convert", "hf-to-orbax", str(ckpt.parent / "hf"), str(tmp_path / "c")]),
        (tmp_path / "h", False, ["convert", "orbax-to-hf", str(ckpt), str(tmp_path / "h"), "--no-tokenizer"]),
        (tmp_path / "o.jsonl", False, ["sample", "--ckpt", str(ckpt), "--prompts", str(tmp_path / "p.jsonl"),
                                       "--out", str(tmp_path / "o.jsonl"), "--no-progress", "--max-new-tokens", "2"]),
        (tmp_path / "e", True, ["eval", "--config", "configs/eval_aime25.py:smoke", "--ckpt", str(ckpt), "--out",
                                str(tmp_path / "e")]),
    ]
    for out, inside, argv in cases:
        with exclusive(out, "held by the test", inside=inside):  # another process's run, as far as flock knows
            assert main(argv) == 2, argv
            assert f"in use by another vt process (pid {os.getpid()}," in one_error_line(capsys), argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "p.jsonl"]  # eval's lock lives inside its --out
    assert list((tmp_path / "e").iterdir()) == []


def test_data_filter_min_above_max_and_a_filter_that_drops_every_row(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt": f"question {i}", "response": "a fine answer " * 3}) + "\n"
                           for i in range(4)))
    out = tmp_path / "out.jsonl"
    assert main(["data", "filter", str(inp), str(out), "--min-chars", "100", "--max-chars", "10"]) == 2
    assert "--max-chars: must be 0 (no limit) or >= min_chars (100), got 10" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert main(["data", "filter", str(inp), str(out), "--min-chars", "1000", "--no-progress"]) == 2
    assert "every one of the 4 input rows was removed (too_short 4)" in one_error_line(capsys)
    assert main(["data", "filter", str(inp), str(tmp_path / "kept.jsonl"), "--no-progress"]) == 0


def test_info_on_a_training_workdir_describes_the_run(ckpt, tmp_path, capsys):
    """It said "model_type is None ... vt supports only Qwen2" (the run's config.json read as a model's)."""
    work = tmp_path / "w"
    (work / "checkpoints").mkdir(parents=True)
    (work / "config.json").write_text(json.dumps({"learner": "sft", "model": {"preset": "tiny"}}))
    (work / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert main(["info", str(work)]) == 0
    out = capsys.readouterr().out
    assert "training workdir, learner sft" in out and "no sealed checkpoint yet" in out
    shutil.copytree(ckpt, work / "checkpoints" / "2")  # a sealed step directory is a model checkpoint
    assert main(["info", str(work)]) == 0
    out = capsys.readouterr().out
    assert "sealed steps: 2" in out and f"newest checkpoint: {work / 'checkpoints' / '2'}" in out
    assert main(["info", str(work), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["steps"] == [2] and d["metrics_lines"] == 2 and d["newest_checkpoint"] == str(work / "checkpoints" / "2")
    assert main(["info", d["newest_checkpoint"]]) == 0  # where it points is a model checkpoint


def test_empty_stop_string_is_named_by_its_flag(ckpt, tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    assert main(["sample", "--ckpt", str(ckpt), "--prompts", str(tmp_path / "p.jsonl"), "--out",
                 str(tmp_path / "o.jsonl"), "--stop", ""]) == 2
    assert "argument --stop: must not be empty" in one_error_line(capsys)


def test_commands_that_read_checkpoints_take_trust_checkpoint():
    from test_cli_fuzz import COMMANDS
    readers = [("profile",), ("self-distill",), ("pipeline",), ("demo",), ("train",), ("merge",), ("sample",),
               ("eval",), ("info",), ("convert", "orbax-to-hf")]
    for words in readers:
        flags = {f for a in COMMANDS[words]._actions for f in a.option_strings}
        assert "--trust-checkpoint" in flags, words
