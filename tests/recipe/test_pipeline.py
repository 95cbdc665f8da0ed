"""The recipe runner: the 3B config validates without running, the demo's CI variant runs end to end with
rising accuracy, and a pipeline killed (-9) in the middle of an RL stage resumes to the straight run's results."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from testutil import REPO, build_once, run_vt
from vt.checkpoint.seal import sealed_steps
from vt.config import load_config
from vt.recipe.runner import recipe_config, validate
from vt.recipe.stages import STAGE_NAMES

DEMO = str(REPO / "configs" / "demo.py")
PRE_RL = ("data", "sft1", "profile", "sft2", "select")


@pytest.mark.parametrize("recipe,base", [("vibethinker_3b", "qwen2.5-coder-3b"), ("vibethinker_1p5b", "qwen2.5-math-1.5b")])
def test_full_config_validates_every_stage_and_names_missing_inputs(recipe, base, tmp_path):
    cfg = recipe_config(load_config(str(REPO / "configs" / f"{recipe}.py")), tmp_path)
    cwd = os.getcwd()
    os.chdir(REPO)  # the config's paths are relative to where vt runs
    try:
        report = validate(cfg, tmp_path)
    finally:
        os.chdir(cwd)
    enabled = [s for s in STAGE_NAMES if s != "data" and cfg.stages.get(s, {}).get("enabled", True)]
    assert list(report["stages"]) == enabled
    problems = "\n".join(report["problems"])
    # every problem is a missing input: the stage configs themselves are valid
    assert all("does not exist" in p or "no file matches" in p for p in report["problems"]), problems
    for missing in (f"config.base_checkpoint: checkpoints/{base}", "config.tokenizer:",
                    "config.stages.sft1.data.train: no file matches data/sft/stage1/*.jsonl",
                    "config.stages.rl_code.data.train: data/rl/code.jsonl", "config.stages.select.probes.math",
                    "config.stages.eval.benchmarks.ifeval.data"):
        assert missing in problems, missing
    assert "aime25" not in problems  # that one ships with the repository
    # The command: --validate lists the problems and exits 1; a real run refuses at once, before any stage.
    proc = run_vt("pipeline", "--config", f"configs/{recipe}.py", "--workdir", str(tmp_path / "v"), "--validate")
    assert proc.returncode == 1 and "config.stages.rl_math.data.train" in proc.stdout, proc.stdout + proc.stderr
    proc = run_vt("pipeline", "--config", f"configs/{recipe}.py", "--workdir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "missing or invalid inputs" in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_bad_stage_field_is_named(tmp_path):
    proc = run_vt("pipeline", "--config", DEMO, "--workdir", str(tmp_path), "--validate",
                  "--config.stages.rl_math.mgpo.gamma='x'")
    assert proc.returncode != 0 and "rl_math" in (proc.stdout + proc.stderr), proc.stdout + proc.stderr
    cfg = recipe_config(load_config(DEMO), tmp_path)
    assert validate(cfg, tmp_path)["problems"] == []  # the demo's inputs come from its data stage


def _demo(workdir: Path, *extra, **kw):
    return subprocess.Popen([sys.executable, "-m", "vt", "demo", "--variant", "ci", "--workdir", str(workdir), *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)


@pytest.fixture(scope="module")
def straight(shared_dir):
    """The demo's CI variant run once a session (testutil.build_once; the tests only read it): (workdir, console)."""
    def run(root: Path):
        proc = _demo(root / "straight")
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-4000:]
        (root / "console.txt").write_text(out)
    root = build_once("demo_ci", run)
    return root / "straight", (root / "console.txt").read_text()


# The demo's stages: every one but on-policy distillation and its baseline (`vt demo --variant opd` adds them)
DEMO_STAGES = [s for s in STAGE_NAMES if s not in ("opd", "opd_sft")]


def manifests(workdir: Path) -> dict:
    return {s: json.loads((workdir / s / "manifest.json").read_text()) for s in DEMO_STAGES}


def test_demo_ci_runs_every_stage_and_accuracy_rises(straight):
    workdir, out = straight
    m = manifests(workdir)
    acc = {s: np.mean(list(v["heldout"].values())) for s, v in m.items() if v["heldout"]}
    assert list(acc) == ["sft1", "sft2", "select", "rl_math", "long2short", "rl_code", "rl_stem", "self_distill",
                         "rl_instruct"]
    # Measured when written (16 prompts x 4 samples per domain, so +-0.06 of noise; the SFT batch order, hence
    # every number, depends on the work directory's path): mean 0.31-0.33 after sft1, 0.41 at the end; code
    # 0.42-0.55 -> 0.78-0.83 through its RL stage; RL training reward up in every stage (e.g. rl_math 0.22 ->
    # 0.38, rl_instruct 0.48 -> 0.65); Long2Short shortens responses (18.1 -> 14.8 tokens).
    assert acc["sft1"] > 0.15, acc  # SFT from scratch learned the tasks (a random model scores 0)
    assert acc["rl_instruct"] >= acc["sft1"] + 0.04, acc  # the recipe, end to end, improves the model
    assert m["rl_code"]["heldout"]["code"] >= m["long2short"]["heldout"]["code"] + 0.1, m["rl_code"]["heldout"]
    for s in ("rl_math", "rl_code", "rl_instruct"):
        assert m[s]["metrics"]["reward_last"] > m[s]["metrics"]["reward_first"], (s, m[s]["metrics"])
    l2s = m["long2short"]["metrics"]
    assert l2s["response_len_last"] < l2s["response_len_first"], l2s
    assert "| rl_instruct |" in out and "| stage |" in out  # the table is printed
    assert m["export"]["metrics"]["greedy_match"] == "4/4"  # transformers' greedy text equals vt's
    assert (workdir / "export" / "hf" / "config.json").is_file()
    assert (workdir / "plot.png").is_file() and any((workdir / "tb").iterdir())
    assert any((workdir / "rl_math" / "tb").iterdir())
    assert set(m["eval"]["metrics"]) == {"demo_math", "demo_code", "demo_stem", "demo_instruct"}
    # A re-run finds everything finished and skips it.
    proc = _demo(workdir)
    rerun, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and rerun.count("done, skipped") == len(DEMO_STAGES), rerun[-2000:]


def test_kill_in_rl_stage_then_resume_equals_straight_run(straight, tmp_path):
    """kill -9 the pipeline once rl_math has saved a checkpoint mid-stage; the re-run resumes rl_math from it and
    ends with the straight run's numbers and bitwise-equal weights. To keep the test short, the stages before RL
    are copied from the straight run (manifests name their files relative to the work directory) and both runs
    stop after rl_math (--until): the later stages start from rl_math's checkpoint with the same configs, so
    bitwise-equal weights there are what the resume has to get right."""
    ref, _ = straight
    workdir = tmp_path / "killed"
    for s in PRE_RL:
        shutil.copytree(ref / s, workdir / s)
    proc = _demo(workdir, "--until", "rl_math")
    deadline = time.time() + 600
    while not sealed_steps(workdir / "rl_math" / "checkpoints"):
        assert proc.poll() is None and time.time() < deadline, "rl_math saved no checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not (workdir / "rl_math" / "manifest.json").exists()
    steps = json.loads((ref / "rl_math" / "manifest.json").read_text())["metrics"]["steps"]
    assert max(sealed_steps(workdir / "rl_math" / "checkpoints")) < steps
    proc = _demo(workdir, "--until", "rl_math")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    assert "rl_math: resuming" in out
    assert not (workdir / "long2short").exists()  # --until: nothing after rl_math ran
    a, b = manifests(ref), {"rl_math": json.loads((workdir / "rl_math" / "manifest.json").read_text())}
    assert b["rl_math"]["resumed"] and not a["rl_math"]["resumed"]
    assert a["rl_math"]["heldout"] == b["rl_math"]["heldout"]
    for key in ("steps", "reward_last", "response_len_last"):  # the last steps ran after the resume
        assert a["rl_math"]["metrics"][key] == b["rl_math"]["metrics"][key], key
    assert a["rl_math"]["fingerprint"] == b["rl_math"]["fingerprint"]
    from vt.checkpoint.params import flat_params, load_model
    pa = flat_params(load_model(ref / a["rl_math"]["checkpoint"]))
    pb = flat_params(load_model(workdir / b["rl_math"]["checkpoint"]))
    assert pa.keys() == pb.keys()
    for k in pa:
        assert np.array_equal(np.asarray(pa[k]), np.asarray(pb[k])), k
