"""CLR: parsing, r_k = (mean v)^M, math-equivalence clusters, the reliability-weighted pick; end to end
through the real sampler on a tiny model."""
import re

import numpy as np
import pytest

from eval_helpers import math_reward  # noqa: F401 (session fixture)
from vt.eval import clr
from vt.eval.answers import math_equivalence
from vt.eval.generation import Completion


def test_parse_claims_and_verdicts():
    reply = "<think>hmm Claim 1: bogus</think>Claim 1: x = 3.\n**Claim 2:** y is even\nClaim 2: dup\nClaim 9: out"
    assert clr.parse_claims(reply, 3) == ["x = 3.", "y is even", None]
    assert clr.parse_verdict("...so it holds.\nVerdict: TRUE") == 1
    assert clr.parse_verdict("Verdict: TRUE ... on reflection\nVerdict: FALSE") == 0
    assert clr.parse_verdict("**Verdict:** correct") == 1
    assert clr.parse_verdict("\\boxed{TRUE}") == 1
    assert clr.parse_verdict("I am not sure.") == 0  # no verdict counts against the claim


def test_reliability_formula():
    v = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]])
    np.testing.assert_allclose(clr.reliability(v), [1.0, 0.8 ** 5, 0.0, 0.6 ** 5])


def test_clr_select_by_formula(math_reward):
    # Majority says 13 (three votes vs two), but the 13 trajectories have weak claims.
    answers = ["12", "13", "\\frac{24}{2}", "13", None, "13.0"]
    verdicts = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 1, 1], [1, 1, 1], [1, 0, 1]])
    r = (verdicts.mean(1)) ** 3  # 1, 1/27, 8/27, 8/27, 1, 8/27
    choice = clr.clr_select(answers, verdicts, math_equivalence(math_reward))
    assert choice.cluster_scores == pytest.approx({0: r[0] + r[2], 1: r[1] + r[3] + r[5]})
    assert choice.index == 0 and choice.answer == "12"
    # flip one claim of trajectory 0: 12 now scores 8/27 + 8/27 < 13's 17/27
    verdicts[0, 2] = 0
    assert clr.clr_select(answers, verdicts, math_equivalence(math_reward)).answer == "13"
    # all reliabilities zero: plain majority among the tied clusters
    assert clr.clr_select(answers, np.zeros((6, 3)), math_equivalence(math_reward)).answer == "13"


class ScriptedVerifier:
    """Claims name their trajectory; a claim is verified TRUE unless it says 'wrong'."""

    def __init__(self):
        self.calls = []

    def generate(self, conversations, n, seed, max_new_tokens=None):
        self.calls.append((len(conversations), max_new_tokens))
        out = []
        for conv in conversations:
            text = conv[-1]["content"]
            if "List the" in text:
                tag = re.search(r"Candidate solution:\n(\w+)", text).group(1)
                reply = "\n".join(f"Claim {m}: {tag} step {m}" for m in (1, 2))  # M = 3: claim 3 missing
            else:
                claim = text.split("Claim about this problem:\n")[1].split("\n")[0]
                reply = f"Checked.\nVerdict: {'FALSE' if 'wrong' in claim else 'TRUE'}"
            out.append([Completion(reply, 5, "stop")])
        return out


def test_run_clr_through_a_generator():
    gen = ScriptedVerifier()
    sols = ["good1 ... \\boxed{5}", "wrong1 ... \\boxed{7}", "wrong2 ... \\boxed{7}", "good2 ... \\boxed{5}"]
    answers = ["5", "7", "7", "5"]
    choice = clr.run_clr(gen, "What is 2+3?", sols, answers, M=3, claim_max_new_tokens=64)
    # good: two TRUE claims + one missing = (2/3)^3; wrong: (0/3)^3 = 0
    assert choice.reliability == pytest.approx([(2 / 3) ** 3, 0, 0, (2 / 3) ** 3])
    assert choice.answer == "5" and gen.calls == [(4, 64), (8, None)]


def test_eval_smoke_with_clr_through_the_real_sampler(tmp_path):
    """configs/eval_aime25.py:smoke: tiny random model + tiny tokenizer, real Engine, CLR enabled."""
    import argparse
    import json
    from pathlib import Path

    from vt.eval import commands
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    cfg = Path(__file__).resolve().parents[2] / "configs" / "eval_aime25.py"
    args, extra = parser.parse_known_args(["eval", "--config", f"{cfg}:smoke", "--out", str(tmp_path)])
    args.config_overrides = extra + [f"--config.data={Path(__file__).resolve().parents[1] / 'assets' / 'aime25.parquet'}"]
    assert args.func(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["problems"] == 2 and summary["clr_runs"] == 4 and "clr@2" in summary
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert all(len(r["clr"]) == 2 and len(r["clr"][0]["verdicts"]) == 2 for r in rows)
    assert all(0 < s["tokens"] <= 8 for r in rows for s in r["samples"])
