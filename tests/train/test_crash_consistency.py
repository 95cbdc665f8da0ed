"""Issue 16 item 2: kill -9 while a checkpoint is sealed or an old one deleted, for SFT and RL: no step Orbax
committed is ever lost and the restart resumes from it with no human involved.

VT_TEST_KILL_AT (vt.checkpoint.manager.crash_test_point) SIGKILLs the learner at an exact point: right after the
seal is written into Orbax's temporary directory (before Orbax's commit rename), and while retired steps are
deleted. A plain kill -9 the moment a new step directory appears covers whatever window remains."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vt.checkpoint.manager import TRASH_DIR
from vt.checkpoint.seal import CHECKSUM_FILE, verify_seal

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"sft": "configs/sft_stage1.py:smoke", "rl": "configs/mgpo_math.py:smoke"}


def _start(learner, workdir, keep, kill_at=None):
    cmd = [sys.executable, "-m", "vt", "train", "--config", CONFIGS[learner], "--workdir", str(workdir),
           "--config.train.steps=40", "--config.checkpoint.every=1", f"--config.checkpoint.keep={keep}",
           "--config.checkpoint.async_save=True", "--config.train.progress=False", "--config.train.eval_every=0"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if kill_at:
        env["VT_TEST_KILL_AT"] = kill_at
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _committed(ck: Path) -> int:
    """The newest step Orbax committed (renamed to its final name): the step a restart must resume from."""
    steps = [int(p.name) for p in ck.iterdir() if p.name.isdigit()] if ck.is_dir() else []
    return max(steps, default=0)


def _stderr_after_kill(p, timeout=600) -> str:
    _, err = p.communicate(timeout=timeout)
    assert p.returncode == -9, f"not killed at the injected point (rc {p.returncode}):\n{err[-3000:]}"
    return err


def _kill_when_step_appears(p, ck: Path, at_least: int, timeout=600) -> str:
    end = time.time() + timeout
    while time.time() < end and p.poll() is None:
        if _committed(ck) >= at_least:
            p.kill()
            return p.communicate()[1]
        time.sleep(0.002)
    raise AssertionError(f"step {at_least} never appeared (rc {p.poll()})")


# Each learner start costs ~40 s of CPU here, so each case kills twice: both learners in the seal window at an
# exact point; then SFT exactly while a retired step is deleted, RL with a plain kill -9 when a new step appears.
@pytest.mark.parametrize("learner,keep,second_kill", [("sft", 1, "deleting-old-step:5+"), ("rl", 2, "plain")])
def test_kill9_in_the_seal_window_and_during_deletion_loses_no_step(tmp_path, learner, keep, second_kill):
    ck = tmp_path / "checkpoints"
    # 1. killed with step 3's seal written into Orbax's temporary directory, before Orbax's commit
    _stderr_after_kill(_start(learner, tmp_path, keep, kill_at="sealed-before-commit:3"))
    expected = _committed(ck)
    assert expected == 2
    # 2. the restart resumes from step 2 (step 3 never committed), and is killed again
    if second_kill == "plain":
        err = _kill_when_step_appears(_start(learner, tmp_path, keep), ck, expected + 2)
    else:
        err = _stderr_after_kill(_start(learner, tmp_path, keep, kill_at=second_kill))
    assert f"resumed from {ck / str(expected)}\n" in err
    newest = _committed(ck)
    assert newest > expected
    # 3. what the next start finds: the newest committed step (sealed now if the kill beat the seal), every
    #    step whole, the trash empty
    from vt.checkpoint.manager import CheckpointConfig, CheckpointManager
    from vt.checkpoint.params import load_model_config
    mgr = CheckpointManager(ck, CheckpointConfig(keep=keep), load_model_config(ck / str(newest)))
    assert mgr.latest_step() == newest
    for step in mgr.all_steps():
        verify_seal(ck / str(step), f"step {step}")
    assert not any((ck / TRASH_DIR).iterdir())
    mgr.close()
