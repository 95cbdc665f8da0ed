"""Asynchronous RL (rollout.max_staleness) on several devices and several processes, on CPU: the sampler on its
own sub-mesh (rollout.sampler_devices: 8 devices split 4 + 4) and 2 processes x 4 devices (launch/local.sh),
against the sampler sharing the learner's devices in one process. `vt train` on configs/instruct_rl.py:smoke
(IFEval-style constraints: a random model meets some, so advantages are not all zero), 3 steps.

What "same" means, and why:
  - split 4 + 4 vs shared on 4 devices (k = 1 and k = 0): bitwise. The learner's programs are the same (a mesh of
    fsdp 4 over devices 0-3 in both), the sampler's too (fsdp 4, over devices 4-7 or 0-3), and the weights reach
    the sampler by a copy (device_put onto its shardings) instead of a shared array: a copy moves bytes. So every
    metric but timings, the rollouts, the buffer and the weights are equal, bit for bit.
  - split 4 + 4 vs shared on 8 devices, and 2 processes x 4 devices vs 1 process x 8 devices (k = 1): the learner
    reduces its gradients over 4 or 8 shards in another order, so weights agree to float32 rounding: parameters
    atol 1e-5, gradient norms rtol 1e-5, the near-zero losses atol 1e-7 (tests/scale/test_multiprocess_rl.py's
    tolerances); the sampled tokens (rollout hashes), rewards, versions and staleness counts are exact, and the
    buffers' behaviour log-probs (the samplers' meshes differ) agree to 1e-5.
On 2 processes every process holds its own half of the buffer (process_<i>-of-2.json in the checkpoint): their
groups in process order equal the 1-process buffer's, with the same versions.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from test_multiprocess import TIMEOUT, _env, _local, _run
from testutil import build_once
from vt.checkpoint.params import flat_params, load_model

RL = ["--config", "configs/instruct_rl.py:smoke"]
STEPS = 3
OVERRIDES = ["--config.train.steps=3", "--config.rollout.sampler.max_new_tokens=16", "--config.checkpoint.every=3",
             "--config.rollout.prompts_per_step=4", "--config.data.eval="]
GRAD_RTOL, LOSS_ATOL, PARAM_ATOL, LOGP_ATOL = 1e-5, 1e-7, 1e-5, 1e-5
TIMINGS = ("time_", "sample_tokens_per_s", "train_tokens_per_s", "mfu")


def _vt(workdir: Path, devices: int, *extra: str) -> None:
    _run(["timeout", "-k", "10", TIMEOUT, sys.executable, "-m", "vt", "train", *RL, "--workdir", workdir,
          *OVERRIDES, *extra], _env(devices), f"vt train on {devices} devices {' '.join(extra)}")


@pytest.fixture(scope="module")
def runs(shared_dir) -> Path:
    """Built once a session (testutil.build_once): the tests only read it."""
    def build(d: Path) -> None:
        for k in (1, 0):
            _vt(d / f"split_k{k}", 8, "--config.rollout.sampler_devices=4", f"--config.rollout.max_staleness={k}")
            _vt(d / f"shared4_k{k}", 4, f"--config.rollout.max_staleness={k}")
        _vt(d / "shared8_k1", 8, "--config.rollout.max_staleness=1")
        _local([sys.executable, "-m", "vt", "train", *RL, "--workdir", d / "two_k1", *OVERRIDES,
                "--config.rollout.max_staleness=1"], "2 processes x 4 devices: vt train (RL, k = 1)", d / "logs")
    return build_once("async_devices", build)


def _metrics(workdir: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {x["step"]: x for x in lines if "loss" in x}


def _params(workdir: Path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in flat_params(load_model(workdir / "checkpoints" / str(STEPS))).items()}


def _buffer(workdir: Path, processes: int) -> list[dict]:
    """The checkpoint's rollout-buffer groups, process by process."""
    item = workdir / "checkpoints" / str(STEPS) / "rollouts"  # the buffer's own checkpoint item
    return [g for p in range(processes)
            for g in json.loads((item / f"process_{p}-of-{processes}.json").read_text())["groups"]]


@pytest.mark.parametrize("k", [1, 0])
def test_split_4_plus_4_equals_shared_4_devices_bitwise(runs, k):
    split, shared = _metrics(runs / f"split_k{k}"), _metrics(runs / f"shared4_k{k}")
    assert sorted(split) == sorted(shared) == [1, 2, 3]
    for s in split:
        a = {key: v for key, v in shared[s].items() if not key.startswith(TIMINGS)}
        b = {key: v for key, v in split[s].items() if not key.startswith(TIMINGS)}
        assert a == b, (s, {key: (a.get(key), b.get(key)) for key in a.keys() | b.keys() if a.get(key) != b.get(key)})
    assert max(split[s]["grad_norm"] for s in split) > 1e-3  # the updates were not all zero
    a, b = _params(runs / f"shared4_k{k}"), _params(runs / f"split_k{k}")
    assert a.keys() == b.keys() and len(a) > 10
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    if k:
        assert _buffer(runs / "split_k1", 1) == _buffer(runs / "shared4_k1", 1)


def _assert_close_runs(expected: Path, actual: Path) -> None:
    one, two = _metrics(expected), _metrics(actual)
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for s in one:
        a, b = one[s], two[s]
        assert b["rollout_hash"] == a["rollout_hash"], f"step {s}: other completions were sampled"
        for key in ("reward_mean", "accuracy", "w_mean", "sample_version_min", "staleness/0", "staleness/1",
                    "staleness_max", "dropped_groups"):
            assert b[key] == a[key], (s, key)
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=GRAD_RTOL, err_msg=f"step {s}")
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=0, atol=LOSS_ATOL, err_msg=f"step {s}")
    pa, pb = _params(expected), _params(actual)
    assert pa.keys() == pb.keys() and len(pa) > 10
    print(f"{actual.name} vs {expected.name}: params max |diff| "
          f"{max(float(np.abs(pa[k] - pb[k]).max()) for k in pa):.3g}")
    for key in pa:
        np.testing.assert_allclose(pb[key], pa[key], rtol=0, atol=PARAM_ATOL, err_msg=key)


def test_split_4_plus_4_matches_shared_8_devices(runs):
    _assert_close_runs(runs / "shared8_k1", runs / "split_k1")


def test_two_processes_agree_on_versions_and_buffer_with_one(runs):
    _assert_close_runs(runs / "shared8_k1", runs / "two_k1")
    one, two = _buffer(runs / "shared8_k1", 1), _buffer(runs / "two_k1", 2)
    assert len(one) == len(two) == 4  # the batch of step 4 (k = 1), sampled by version 2: 2 groups per process
    for a, b in zip(one, two):
        assert b["version"] == a["version"] == STEPS - 1
        assert (b["prompt"], b["domain"], b["rewards"], b["correct"]) == (a["prompt"], a["domain"], a["rewards"],
                                                                        a["correct"])
        assert [x["ids"] for x in b["samples"]] == [x["ids"] for x in a["samples"]]
        for x, y in zip(a["samples"], b["samples"]):
            np.testing.assert_allclose(y["logprobs"], x["logprobs"], rtol=0, atol=LOGP_ATOL)
