"""Test helpers shared by tests/eval and tests/datagen: a stand-in model that answers the AIME 2025 problems
from a fixed script, and session fixtures (test modules import the ones they use)."""
from __future__ import annotations

from pathlib import Path

import pytest

from vt.eval.generation import Completion

AIME = Path(__file__).resolve().parent / "assets" / "aime25.parquet"

# One pattern per problem (cycled): C = correct answer, W = wrong answer, N = no answer (truncated).
PATTERNS = ["CCCC", "CWWN", "WCWC", "NNNN", "WWCC", "CNWN", "WNNN", "CCWW"]


def script_text(gold: int, kind: str, j: int) -> str:
    """Correct and wrong answers alternate between two spellings, so voting must use math equivalence."""
    if kind == "C":
        ans = str(gold) if j % 2 == 0 else f"\\frac{{{2 * gold}}}{{2}}"
    elif kind == "W":
        ans = str(gold + 1) if j % 2 == 0 else f"{gold + 1}.0"
    else:
        return "<think>Let me think about this for a very long time and"
    return f"<think>Working on it; maybe \\boxed{{{gold + 5}}}?</think>The answer is $\\boxed{{{ans}}}$."


class StandIn:
    """Generator that knows each AIME problem's answer and follows PATTERNS; counts its calls."""

    def __init__(self, problems, fail_on_call: int | None = None):
        self.gold = {p["prompt"][0]["content"]: (i, int(p["reward_model"]["ground_truth"]))
                     for i, p in enumerate(problems)}
        self.calls = 0
        self.fail_on_call = fail_on_call

    def generate(self, conversations, n, seed, max_new_tokens=None):
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise KeyboardInterrupt("killed")
        out = []
        for conv in conversations:
            i, gold = self.gold[conv[-1]["content"]]
            pat = PATTERNS[i % len(PATTERNS)]
            out.append([Completion(script_text(gold, pat[j % 4], j), 100 + j,
                                   "length" if pat[j % 4] == "N" else "stop") for j in range(n)])
        return out


@pytest.fixture(scope="session")
def aime_rows():
    import pyarrow.parquet as pq
    return pq.read_table(AIME).to_pylist()


@pytest.fixture(scope="session")
def math_reward():
    from vt.rewards.math_reward import MathReward
    with MathReward(workers=1) as r:
        yield r
