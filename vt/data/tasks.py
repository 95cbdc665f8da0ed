"""Built-in synthetic verifiable tasks: tiny-model stand-ins for the recipe's math/code/instruction data.

Every record has the shape the real data has (chat `messages`, `ground_truth` / `tests` / `constraints`), so
the same SFT pipeline, sampler, verifiers and RL learner run on them unchanged. They exist so that the whole
recipe can be exercised on a laptop CPU in minutes (`make demo`, the RL tests).

`noise` makes a deliberately imperfect SFT teacher: with that probability the assistant's answer is a wrong
one, so a model trained on it starts RL with a measurable, improvable accuracy.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np


def math_record(index: int, seed: int, *, max_operand: int = 4, noise: float = 0.0, with_answer: bool = True,
                split: str = "train") -> dict:
    """`a+b` with a, b in [0, max_operand]; answer boxed: `\\boxed{a+b}`."""
    rng = np.random.default_rng([seed, {"train": 0, "eval": 1}[split], index])
    a, b = (int(x) for x in rng.integers(0, max_operand + 1, 2))
    answer = a + b
    rec = {"id": f"math-{split}-{index}", "domain": "math",
           "messages": [{"role": "user", "content": f"{a}+{b}"}], "ground_truth": str(answer)}
    if with_answer:
        shown = answer
        if rng.random() < noise:
            shown = int(rng.choice([v for v in range(2 * max_operand + 1) if v != answer]))
        rec["messages"].append({"role": "assistant", "content": f"\\boxed{{{shown}}}"})
    return rec


def math_corpus(max_operand: int = 4) -> list[str]:
    """Every text the math task can produce: enough to train a tokenizer that covers it."""
    texts = []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            texts.append(f"{a}+{b}")
    texts += [f"\\boxed{{{v}}}" for v in range(2 * max_operand + 1)]
    return texts


def write_jsonl(path: Path | str, records: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path
