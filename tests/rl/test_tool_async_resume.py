"""Asynchronous RL with tools resumes exactly (issue 52, item 3). A sample parks only within one generate call (one
weights version), so no checkpoint holds a parked sample; at rollout.max_staleness = 1 a checkpoint holds the rollout
buffer of finished multi-turn samples (policy masks, tool calls and errors: vt.rl.buffer). On the tool demo's SFT-1
(tests/rl/test_tool_learning.py's task, which calls the tool in about half of its samples): a run SIGKILLed while
step 3's update is in flight (checkpoint 2 sealed, holding step 3's batch sampled by version 1) and restarted ends
with the weights, rollouts and metrics of 3 straight steps; every buffered sample's policy_version is the version
of its group (the one that began it), in the straight run and after the restart (the restarted learner's engine
counted from 0 before vt.rl.learner set it to the run's version: the batch ahead, sampled by version 2, said 0).
42 s at load 5.8 on a 2-core box, beside the shared fixture."""
import json
import signal

import numpy as np
import pytest

from rl_helpers import metrics, rl_config, run_rl_process
from test_async import assert_params_equal, final_params
from testutil import tool_demo_sft1
from vt.rl.buffer import RolloutBuffer
from vt.rl.learner import train_rl

TOOLS = {"max_turns": 2, "max_tool_output_tokens": 32, "timeout_s": 5.0, "workers": 8}  # the demo's (configs/demo.py)
STEPS = 3


@pytest.fixture(scope="module")
def demo_sft():
    root = tool_demo_sft1()
    data = root / "data"
    return {"root": data, "ckpt": (root / "final").resolve(), "tok": data / "tokenizer"}


def overrides(task: dict) -> dict:
    return {"data.train": str(task["root"] / "rl_tools.jsonl"), "data.eval": "", "train.eval_every": 0,
            "rollout.group_size": 4, "rollout.prompts_per_step": 4, "rollout.max_staleness": 1,
            "rollout.sampler.tools": TOOLS, "rollout.sampler.max_new_tokens": 64,
            "rollout.sampler.steps_per_call": 32, "train.steps": STEPS, "checkpoint.every": 1,
            # a sample a row: few row shapes to compile
            "train.pack_rows": False, "train.share_prompts": False}


@pytest.fixture
def puts(monkeypatch):
    """Every (version, [each sample's policy_version]) the rollout buffer is given, through its own put."""
    seen, put = [], RolloutBuffer.put

    def spy(self, scored, version):
        seen.append((version, [s.policy_version for g in scored.samples for s in g]))
        return put(self, scored, version)
    monkeypatch.setattr(RolloutBuffer, "put", spy)
    return seen


def test_tool_async_kill_then_restart_equals_a_straight_run(demo_sft, tmp_path, puts):
    over = overrides(demo_sft)
    straight = tmp_path / "straight"
    train_rl(rl_config(demo_sft, **over), straight)
    # batches 0 and 1 at version 0 (the first k + 1 steps), then batch s + 1 by version s, up to the one a
    # longer run would use (so the last checkpoint holds it)
    assert [v for v, _ in puts] == [0, 0, 1, 2]
    assert all(pv == [v] * 16 for v, pv in puts), puts
    puts.clear()

    killed = tmp_path / "killed"
    proc = run_rl_process(demo_sft, over, killed, env={"VT_TEST_KILL_AT": f"rl-update-in-flight:{STEPS}"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert max(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit()) == STEPS - 1
    # the checkpoint holds step 3's batch, sampled by version 1: multi-turn samples with their masks
    groups = [g for f in sorted((killed / "checkpoints" / str(STEPS - 1) / "rollouts").rglob("*.json"))
              for g in json.loads(f.read_text())["groups"]]
    assert [g["version"] for g in groups] == [STEPS - 2] * 4
    samples = [x for g in groups for x in g["samples"]]
    turns = [x for x in samples if "policy" in x]  # a sample without a tool turn has no mask (all the policy's)
    assert all(len(x["policy"]) == len(x["ids"]) and not all(x["policy"]) for x in turns)  # tool turns masked out
    assert any(x.get("tool_calls") for x in turns)

    train_rl(rl_config(demo_sft, **over), killed)
    assert [v for v, _ in puts] == [STEPS - 1]  # only the batch ahead is sampled: step 3's is the checkpoint's
    assert all(pv == [v] * 16 for v, pv in puts), puts  # the restarted engine counts from the run's version

    a = {r["step"]: r for r in metrics(straight) if "rollout_hash" in r}
    b = {r["step"]: r for r in metrics(killed) if "rollout_hash" in r}
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert any(a[s]["tool_calls_ok"] for s in a)  # the updates learned from tool calls
    for s in a:
        for key in ("rollout_hash", "loss", "objective", "grad_norm", "is_weight_mean", "mismatch_kl", "entropy",
                    "accuracy", "tool_calls_ok", "sample_version_min", "staleness/1", "tokens_real"):
            assert a[s][key] == b[s][key], (s, key, a[s][key], b[s][key])
    assert_params_equal(final_params(straight, STEPS), final_params(killed, STEPS))
    assert np.isfinite(a[STEPS]["loss"])
