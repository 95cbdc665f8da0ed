"""Multi-host behaviour on CPU: 2 processes x 4 simulated devices (launch/local.sh, jax.distributed over
127.0.0.1) against 1 process x 8 devices, on a (data 2, fsdp 2, tensor 2) mesh.

One module fixture runs seven launches (about 4-5 minutes on a small box):
  1. 1 process x 8 devices: 3 steps of the real SFT train step, save the parameters (tests/scale/mp_worker.py)
  2. 2 processes x 4 devices via launch/local.sh: the same 3 steps on the same global batches, save
     collectively, and restore checkpoint 1
  3. 2 processes x 4 devices via launch/local.sh: `vt train` (configs/sft_stage1.py:smoke) for 4 steps
  4. 1 process x 8 devices (the environment launch/local.sh sets, with one process): the same `vt train`
  5. 1 process x 8 devices: a copy of run 3 cut back to its step-2 checkpoint resumes to step 4
  6. 2 processes x 4 devices: a copy of run 4 cut back to its step-2 checkpoint resumes to step 4
  7. 1 process x 8 devices on another mesh (fsdp 8): restore checkpoints 2 and 3 (model and learner state)
     and the step-4 models of runs 4, 5 and 6

`vt train` reads its data through logical data shards (data.num_shards = 4 in the smoke config,
vt.data.shards): the global batch of each step is the same on one process or two, and the data-iterator
state is saved per shard, so run 5 continues the 2-process run on one process with the same batches, and
run 6 the 1-process run on two.

Tolerance: the two partitionings reduce in different orders, so losses and parameters after 3-4 AdamW steps
agree to float32 rounding, not bitwise: |loss difference| <= 1e-5 (relative), |parameter difference| <= 1e-5
(observed about 1e-7). Restores are exact (array_equal): a checkpoint moves bytes, it does not compute. Runs
4 and 5 are both one process, so their batches are compared by hash, exactly.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testutil import REPO, build_once

LOCAL = REPO / "launch" / "local.sh"
WORKER = REPO / "tests" / "scale" / "mp_worker.py"
VT_MP = REPO / "tests" / "scale" / "vt_mp.py"
TIMEOUT = 420
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-5
VT_TRAIN = ["--config", "configs/sft_stage1.py:smoke"]
VT_OVERRIDES = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
                "--config.train.progress=False", "--config.train.steps=4", "--config.checkpoint.every=2",
                "--config.data.eval=", "--config.checkpoint.best_metric="]


def _env(devices: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))}
    env["JAX_PLATFORMS"] = "cpu"
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _run(cmd: list, env: dict, what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT + 60)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise AssertionError(f"{what} failed (status {proc.returncode}):\n{tail}")
    return proc


def _single(args: list, what: str):
    return _run(["timeout", "-k", "10", TIMEOUT, sys.executable, WORKER, *args], _env(8), what)


def _single_vt(workdir: Path, what: str):
    """`vt train` as launch/local.sh -n 1 -d 8 would start it (JAX_PLATFORMS=cpu, 8 host devices, no
    coordinator), under `timeout -k`."""
    cmd = ["timeout", "-k", "10", TIMEOUT, sys.executable, "-m", "vt", "train", *VT_TRAIN, "--workdir", workdir,
           *VT_OVERRIDES]
    return _run(cmd, _env(8), what)


def _local(args: list, what: str, log_dir: Path):
    return _run(["bash", LOCAL, "-n", 2, "-d", 4, "--timeout", TIMEOUT, "--log-dir", log_dir, "--", *args], _env(), what)


@pytest.fixture(scope="module")
def runs(shared_dir) -> Path:
    """Built once a session (testutil.build_once): the tests only read it."""
    def build(d: Path) -> None:
        _single(["train", "--out", d / "single.npz", "--save", d / "single_ck"], "1 process x 8 devices: train")
        _local([sys.executable, WORKER, "train", "--out", d / "multi.npz", "--save", d / "multi_ck",
                "--restore", d / "single_ck", "--restore-out", d / "multi_from_single.npz"],
               "2 processes x 4 devices: train", d / "logs_train")
        _local([sys.executable, VT_MP, "train", *VT_TRAIN, "--workdir", d / "vt_run", *VT_OVERRIDES],
               "2 processes x 4 devices: vt train", d / "logs_vt")
        _single_vt(d / "vt_single", "1 process x 8 devices: vt train")
        # The 2-process run as it stood at its step-2 checkpoint (step 4 and its metrics removed), resumed alone.
        shutil.copytree(d / "vt_run", d / "vt_resume", ignore=shutil.ignore_patterns("tb"))
        shutil.rmtree(d / "vt_resume" / "checkpoints" / "4")
        _single_vt(d / "vt_resume", "1 process x 8 devices: vt train resumed from the 2-process step-2 checkpoint")
        # And the other way round: the 1-process run at its step-2 checkpoint, resumed on 2 processes.
        shutil.copytree(d / "vt_single", d / "vt_resume2", ignore=shutil.ignore_patterns("tb"))
        shutil.rmtree(d / "vt_resume2" / "checkpoints" / "4")
        _local([sys.executable, VT_MP, "train", *VT_TRAIN, "--workdir", d / "vt_resume2", *VT_OVERRIDES],
               "2 processes x 4 devices: vt train resumed from the 1-process step-2 checkpoint", d / "logs_resume2")
        _single(["restore", "--mesh", "1,8,1", "--ckpt", d / "multi_ck", "--out", d / "single_from_multi.npz",
                 "--ckpt", d / "vt_run" / "checkpoints" / "4", "--out", d / "vt_model.npz",
                 "--ckpt", d / "vt_single" / "checkpoints" / "4", "--out", d / "vt_single_model.npz",
                 "--ckpt", d / "vt_resume" / "checkpoints" / "4", "--out", d / "vt_resume_model.npz",
                 "--ckpt", d / "vt_resume2" / "checkpoints" / "4", "--out", d / "vt_resume2_model.npz",
                 "--train-state", f"{d / 'vt_run'}:4", "--train-state-out", d / "vt_state.npz",
                 *VT_TRAIN, *(f"--override={o}" for o in VT_OVERRIDES)],
                "1 process x 8 devices (fsdp 8): restore")
    return build_once("scale", build)


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files if k.startswith("param/")}


def assert_params_close(expected: Path, actual: Path, atol: float, what: str) -> None:
    """The same parameter names, every one within atol; prints the largest difference."""
    a, b = _params(expected), _params(actual)
    assert a.keys() == b.keys() and len(a) > 10
    print(f"{what}: max |diff| {max(float(np.abs(a[k] - b[k]).max()) for k in a):.3g}")
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=atol, err_msg=k)


def test_two_processes_train_like_one(runs):
    with np.load(runs / "single.npz") as one, np.load(runs / "multi.npz") as two:
        assert int(one["processes"]) == 1 and int(two["processes"]) == 2
        np.testing.assert_allclose(two["loss"], one["loss"], rtol=LOSS_RTOL)
        np.testing.assert_allclose(two["grad_norm"], one["grad_norm"], rtol=LOSS_RTOL)
        assert one["loss"][-1] < one["loss"][0]  # it trained
    a, b = _params(runs / "single.npz"), _params(runs / "multi.npz")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=PARAM_ATOL, err_msg=k)


def test_checkpoint_from_two_processes_restores_in_one(runs):
    """Written by 2 processes on (2, 2, 2), read by 1 process on (1, 8, 1): resharded on restore, exact."""
    saved, restored = _params(runs / "multi.npz"), _params(runs / "single_from_multi.npz")
    assert saved.keys() == restored.keys()
    for k in saved:
        np.testing.assert_array_equal(restored[k], saved[k], err_msg=k)
    assert not list(runs.glob(".multi_ck.tmp*")), "temporary checkpoint directory left behind"


def test_checkpoint_from_one_process_restores_in_two(runs):
    saved, restored = _params(runs / "single.npz"), _params(runs / "multi_from_single.npz")
    assert saved.keys() == restored.keys()
    for k in saved:
        np.testing.assert_array_equal(restored[k], saved[k], err_msg=k)


def test_vt_train_on_two_processes(runs):
    """`vt train` under launch/local.sh: one metrics line per step (process 0 writes), sealed checkpoints with
    both processes' data-iterator state, and the learner state restores in one process on another mesh."""
    work = runs / "vt_run"
    lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    assert all(np.isfinite(x["loss"]) for x in lines)
    for step in (2, 4):
        d = work / "checkpoints" / str(step)
        assert (d / "vt_checksums.json").is_file()
        # One data-iterator file per logical shard (4 in the smoke config), two written by each process.
        assert sorted(p.name for p in (d / "data").glob("*.json")) == [f"shard_{s}-of-4.json" for s in range(4)]
    model, state = _params(runs / "vt_model.npz"), _params(runs / "vt_state.npz")
    assert model.keys() == state.keys() and len(model) > 10
    for k in model:
        np.testing.assert_array_equal(state[k], model[k], err_msg=k)
    with np.load(runs / "vt_state.npz") as z:
        assert int(z["step"]) == 4
        moments = [z[k] for k in z.files if k.startswith("opt/")]
        assert moments and all(np.isfinite(m).all() for m in moments)
        assert any(np.abs(m).max() > 0 for m in moments)  # AdamW moments were written, not zeros


def _metrics(workdir: Path) -> list[dict]:
    return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_vt_train_two_processes_like_one(runs):
    """Issue 9: `vt train` on 2 processes x 4 devices gives the losses and parameters of 1 process x 8 devices
    (the same global batches, whatever the process count)."""
    two, one = _metrics(runs / "vt_run"), _metrics(runs / "vt_single")
    assert [x["step"] for x in one] == [x["step"] for x in two] == [1, 2, 3, 4]
    loss_one, loss_two = np.array([x["loss"] for x in one]), np.array([x["loss"] for x in two])
    print(f"vt train losses, 1 process: {loss_one.tolist()}, 2 processes: {loss_two.tolist()}, "
          f"max |diff| {np.abs(loss_one - loss_two).max():.3g}")
    np.testing.assert_allclose(loss_two, loss_one, rtol=LOSS_RTOL)
    np.testing.assert_allclose([x["grad_norm"] for x in two], [x["grad_norm"] for x in one], rtol=LOSS_RTOL)
    assert [x["loss_tokens"] for x in two] == [x["loss_tokens"] for x in one]  # the same tokens, exactly
    assert_params_close(runs / "vt_single_model.npz", runs / "vt_model.npz", PARAM_ATOL,
                        "vt train params after 4 steps")


@pytest.mark.parametrize("resumed_run,straight_run", [("vt_resume", "vt_single"), ("vt_resume2", "vt_run")],
                         ids=["2-processes-to-1", "1-process-to-2"])
def test_vt_train_checkpoint_resumes_on_another_process_count(runs, resumed_run, straight_run):
    """A step-2 checkpoint resumed on the other process count continues with the batches of the straight run
    on that count (equal loss tokens and losses; on 1 process also equal hashes of the whole global batch,
    the metrics' batch_hash being process 0's rows) and ends at the straight run's parameters."""
    straight, resumed = _metrics(runs / straight_run), _metrics(runs / resumed_run)
    assert [x["step"] for x in resumed] == [1, 2, 3, 4]
    for s, r in zip(straight[2:], resumed[2:]):
        assert r["loss_tokens"] == s["loss_tokens"] and r["tokens"] == s["tokens"], r["step"]
        assert r["batch_hash"] == s["batch_hash"], r["step"]
        np.testing.assert_allclose(r["loss"], s["loss"], rtol=LOSS_RTOL)
    assert_params_close(runs / "vt_single_model.npz", runs / f"{resumed_run}_model.npz", PARAM_ATOL,
                        f"{resumed_run} params after 4 steps")
