"""A small verifiable RL task for the learner tests: `a+b` -> `\\boxed{a+b}`, a tiny model SFT'd on noisy
answers (half wrong) so that it starts RL at roughly 20-40% accuracy, measured by the real math verifier."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vt.config import to_dataclass
from vt.data.tasks import math_corpus, math_record
from vt.data.tokenizer import build_tiny_tokenizer, render_qwen_chat
from vt.io import write_jsonl
from vt.rl.learner import RLConfig
from vt.train.sft import SftConfig, train

MAX_OPERAND = 3
NOISE = 0.5


def build_task(root: Path, sft_steps: int = 400, preset: str = "tiny") -> dict:
    root.mkdir(parents=True, exist_ok=True)
    chat = render_qwen_chat([{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "\\boxed{3}"}])
    build_tiny_tokenizer(root / "tok", texts=math_corpus(MAX_OPERAND) * 20 + [chat] * 20, vocab_size=300)
    write_jsonl(root / "sft.jsonl", [math_record(i, 0, noise=NOISE, max_operand=MAX_OPERAND) for i in range(2000)])
    write_jsonl(root / "rl.jsonl", [math_record(i, 0, with_answer=False, max_operand=MAX_OPERAND) for i in range(500)])
    write_jsonl(root / "eval.jsonl", [math_record(i, 0, with_answer=False, split="eval", max_operand=MAX_OPERAND)
                                      for i in range(64)])
    sft = to_dataclass(SftConfig, {
        "model": {"preset": preset},  # "tiny-qwen3": the Qwen3-shaped twin (tests/model/test_qwen3_twin.py)
        "data": {"kind": "chat", "train": str(root / "sft.jsonl"), "tokenizer": str(root / "tok"), "seq_len": 64,
                 "global_batch_size": 16, "num_epochs": 1.0},
        "optim": {"lr": 3e-3, "final_lr": 1e-4, "warmup_frac": 0.05},
        "train": {"steps": sft_steps, "progress": False},
        "checkpoint": {"every": 100000, "keep": 1, "async_save": False}})
    train(sft, root / "sft")
    return task_paths(root)


def task_paths(root: Path) -> dict:
    ckpt = sorted((root / "sft" / "checkpoints").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)[-1]
    return {"root": root, "ckpt": ckpt, "tok": root / "tok"}


def shared_task() -> dict:
    """The tiny preset's task, built once per test session for every module and xdist worker that asks
    (testutil.build_once): it is only read."""
    from testutil import build_once  # tests/ is on the path under pytest; bench/ imports this module without it
    return task_paths(build_once("rl_task", build_task))


def rl_config(task: dict, **overrides) -> RLConfig:
    root = task["root"]
    cfg = {
        "model": {"init_checkpoint": str(task["ckpt"])},
        "data": {"train": str(root / "rl.jsonl"), "eval": str(root / "eval.jsonl"), "tokenizer": str(task["tok"]),
                 "domain": "math"},
        "rollout": {"group_size": 8, "prompts_per_step": 16,
                    "sampler": {"max_new_tokens": 8, "batch_size": 64, "steps_per_call": 8}},
        "mgpo": {"gamma": 1.0},
        "optim": {"lr": 1e-3, "final_lr": 1e-3, "warmup_frac": 0.0},
        "train": {"steps": 30, "eval_every": 10, "eval_samples": 4, "progress": False},
        "checkpoint": {"every": 1000, "keep": 2, "async_save": False},
    }
    for key, value in overrides.items():
        *sections, field = key.split(".")
        group = cfg
        for section in sections:
            group = group.setdefault(section, {})
        group[field] = value
    return to_dataclass(RLConfig, cfg)


def metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_rl_process(task: dict, overrides: dict, workdir: Path, env: dict | None = None,
                   timeout: int = 900) -> subprocess.CompletedProcess:
    """tests/rl/rl_worker.py: the RL learner on `task` in a fresh process (`env` added to this one's)."""
    spec = json.dumps({"task": {k: str(v) for k, v in task.items()}, "overrides": overrides})
    return subprocess.run([sys.executable, str(Path(__file__).with_name("rl_worker.py")), spec, str(workdir)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
