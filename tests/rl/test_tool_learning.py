"""RL with the `python` tool learns (issue 52), on the demo's tool task (`vt demo --variant tools`: products of two
2-digit numbers, which the tiny model cannot work out in its head but can copy from the tool's output). Its SFT
(the demo's own data and sft1 stage, built once a session) leaves a model that calls the tool in about half of its
samples and guesses in the rest; RL with the tool in the rollout raises held-out accuracy by >= 0.2 and the share of
samples that call the tool, over two seeds; the same model trained without the tool (its calls never answered)
stays near its start: the gain is the tool's, not arithmetic learned in the policy's head."""

from pathlib import Path

import pytest

from rl_helpers import metrics, rl_config
from testutil import tool_demo_sft1

TOOLS = {"max_turns": 2, "max_tool_output_tokens": 32, "timeout_s": 5.0, "workers": 8}  # the demo's (configs/demo.py)
STEPS = 10


@pytest.fixture(scope="module")
def demo_sft():
    root = tool_demo_sft1()
    ckpt = (root / "final").resolve()
    data = root / "data"
    return {"root": data, "ckpt": ckpt, "tok": data / "tokenizer"}


def run(task, tmp_path: Path, seed: int, tools: dict | None):
    d = task["root"]
    cfg = rl_config(task, **{
        "data.train": str(d / "rl_tools.jsonl"), "data.eval": str(d / "heldout_tools.jsonl"), "data.seed": seed,
        "rollout.prompts_per_step": 8, "rollout.sampler.seed": seed, "rollout.sampler.tools": tools,
        "rollout.sampler.max_new_tokens": 64, "rollout.sampler.steps_per_call": 32,
        "train.steps": STEPS, "train.eval_every": STEPS, "train.eval_prompts": 64,
        # a sample a row: one or two row shapes to compile, not one a step (packing and shared prompts with tool
        # turns are tested in test_tool_masks.py and test_tool_parity.py)
        "train.pack_rows": False, "train.share_prompts": False})
    from vt.rl.learner import train_rl
    out = tmp_path / f"seed{seed}-{'tools' if tools else 'none'}"
    result = train_rl(cfg, out)
    rows = [r for r in metrics(out) if "loss" in r]
    return result.eval_history, rows


def test_rl_with_the_tool_raises_accuracy_and_tool_use(demo_sft, tmp_path):
    for seed in (0, 1):
        history, rows = run(demo_sft, tmp_path, seed, TOOLS)
        (s0, before), (s1, after) = history[0], history[-1]
        share = [r["tool_calls_ok"] for r in rows]
        print(f"seed {seed}: held-out accuracy {history}, tool_calls_ok by step {[round(x, 3) for x in share]}")
        assert (s0, s1) == (0, STEPS)
        assert 0.05 <= before <= 0.7, before  # SFT left something to learn, and some copies right to learn from
        assert after >= before + 0.2, history
        assert sum(share[-2:]) / 2 > sum(share[:2]) / 2 + 0.1, share
    history, rows = run(demo_sft, tmp_path, 0, None)
    print(f"without the tool: held-out accuracy {history}")
    (_, before), (_, after) = history[0], history[-1]
    assert after <= before + 0.05, history
