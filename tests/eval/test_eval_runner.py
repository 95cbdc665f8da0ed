"""vt eval on the real AIME 2025 file with a stand-in model: exact scores, resume = straight run, reports."""
import json
import math
from pathlib import Path
from fractions import Fraction

import pytest

from eval_helpers import AIME, PATTERNS, StandIn
from eval_helpers import aime_rows, math_reward  # noqa: F401 (session fixtures)
from vt import VtError
from vt.eval.runner import ClrConfig, EvalConfig, run_eval
from vt.rewards.registry import CodeConfig, MathConfig, RewardsConfig
from vt.sampling.config import SamplerConfig


def config(**kw):
    base = dict(name="aime25", data=str(AIME), domain="math", ks=(1, 2, 4), maj_ks=(2, 4), chunk_problems=4,
                progress=False, sampling=SamplerConfig(n=4))
    return EvalConfig(**{**base, **kw})


def expected_summary():
    """Hand rules: pass@k = 1 - C(n-c, k) / C(n, k); maj: most votes, ties to the earliest; N does not vote."""
    avg, p2, maj2, maj4, trunc = [], [], [], [], []
    for i in range(30):
        pat = PATTERNS[i % len(PATTERNS)]
        c = pat.count("C")
        avg.append(Fraction(c, 4))
        p2.append(1 - Fraction(math.comb(4 - c, 2), math.comb(4, 2)))
        for k, acc in ((2, maj2), (4, maj4)):
            votes = [x for x in pat[:k] if x != "N"]
            if not votes:
                acc.append(0)
                continue
            nc, nw = votes.count("C"), votes.count("W")
            acc.append(int(nc > nw or (nc == nw and votes[0] == "C")))
        trunc.append(Fraction(pat.count("N"), 4))
    mean = lambda xs: float(sum(Fraction(x) for x in xs) / len(xs))  # noqa: E731
    return {"avg@n": mean(avg), "pass@1": mean(avg), "pass@2": mean(p2), "maj@2": mean(maj2), "maj@4": mean(maj4),
            "truncated": mean(trunc)}


def test_aime_stand_in_exact_scores(tmp_path, aime_rows, math_reward):
    gen = StandIn(aime_rows)
    summary = run_eval(config(), tmp_path, generator=gen, reward=math_reward)
    exp = expected_summary()
    for k, v in exp.items():
        assert summary[k] == pytest.approx(v, abs=1e-12), k
    # pass@4 = fraction of problems with any correct sample
    assert summary["pass@4"] == pytest.approx(sum("C" in PATTERNS[i % 8] for i in range(30)) / 30)
    assert summary["problems"] == 30 and summary["verifier_errors"] == 0 and gen.calls == 8
    assert summary["mean_tokens"] == pytest.approx(101.5)
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(30))
    assert rows[0]["ground_truth"] == 70 and rows[0]["samples"][1]["answer"] == "\\frac{140}{2}"
    assert rows[0]["samples"][1]["correct"] is True
    assert (tmp_path / "plot.png").stat().st_size > 1000
    assert "| aime25 | 30 |" in (tmp_path / "summary.md").read_text()


def test_killed_and_resumed_equals_straight(tmp_path, aime_rows, math_reward):
    straight = run_eval(config(), tmp_path / "a", generator=StandIn(aime_rows), reward=math_reward)
    with pytest.raises(KeyboardInterrupt):
        run_eval(config(), tmp_path / "b", generator=StandIn(aime_rows, fail_on_call=4), reward=math_reward)
    assert len((tmp_path / "b" / "results.jsonl").read_text().splitlines()) == 12  # 3 chunks of 4 done
    # a kill in the middle of a write: half of the last line, and one whole row of that chunk missing
    path = tmp_path / "b" / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:10]) + lines[10][:50])
    gen = StandIn(aime_rows)
    resumed = run_eval(config(), tmp_path / "b", generator=gen, reward=math_reward)
    assert gen.calls == 6  # chunk 2 regenerated (its rows 8, 9 kept), chunks 3..7 new
    assert resumed == straight
    a = (tmp_path / "a" / "results.jsonl").read_text().splitlines()
    b = (tmp_path / "b" / "results.jsonl").read_text().splitlines()
    assert sorted(a) == sorted(b)
    # a finished run resumes to the same summary without generating anything
    gen = StandIn(aime_rows)
    assert run_eval(config(), tmp_path / "b", generator=gen, reward=math_reward) == straight and gen.calls == 0


def test_resume_refuses_other_settings_and_ks_can_change(tmp_path, aime_rows, math_reward):
    run_eval(config(limit=4), tmp_path, generator=StandIn(aime_rows), reward=math_reward)
    with pytest.raises(VtError, match="different settings"):
        run_eval(config(limit=4, sampling=SamplerConfig(n=4, seed=1)), tmp_path, generator=StandIn(aime_rows),
                 reward=math_reward)
    s = run_eval(config(limit=4, ks=(1, 3)), tmp_path, generator=StandIn(aime_rows), reward=math_reward)
    assert "pass@3" in s and "pass@2" not in s
    # The sampler's speed settings (slots, decode steps per call, KV pages) do not change the samples: accepted.
    speed = SamplerConfig(n=4, batch_size=3, steps_per_call=5, page_size=32, kv_pages=100, refill=False)
    gen = StandIn(aime_rows)
    assert run_eval(config(limit=4, sampling=speed), tmp_path, generator=gen, reward=math_reward) and gen.calls == 0
    with pytest.raises(VtError, match="different settings"):
        run_eval(config(limit=4, sampling=SamplerConfig(n=4, stop_strings=("x",))), tmp_path,
                 generator=StandIn(aime_rows), reward=math_reward)
    # The domain's reward options are result settings, its worker count and other domains' options are not.
    gen = StandIn(aime_rows)
    more = RewardsConfig(math=MathConfig(workers=5), code=CodeConfig(test_time_limit_s=1.0))
    assert run_eval(config(limit=4, rewards=more), tmp_path, generator=gen, reward=math_reward) and gen.calls == 0
    with pytest.raises(VtError, match=r"different settings \(differs in \['rewards'\]\)"):
        run_eval(config(limit=4, rewards=RewardsConfig(math=MathConfig(tail_chars=100))), tmp_path,
                 generator=StandIn(aime_rows), reward=math_reward)


def test_config_validation():
    with pytest.raises(VtError, match="config.ks"):
        config(ks=(8,))
    with pytest.raises(VtError, match="runs"):
        config(clr=ClrConfig(enabled=True, K=4, runs=2))
    with pytest.raises(VtError, match="config.domain"):
        config(domain="chess")


def test_eval_config_files_load():
    from vt.config import load_config, to_dataclass
    configs = Path(__file__).resolve().parents[2] / "configs"
    for spec in ("eval_aime25.py", "eval_aime25.py:clr", "eval_aime25.py:smoke", "eval_gpqa.py", "eval_gpqa.py:smoke",
                 "eval_lcb.py", "eval_ifeval.py"):
        to_dataclass(EvalConfig, load_config(f"{configs / spec}"))


def test_ifeval_levels(tmp_path):
    """Prompt and instruction level, strict, through the real instruct reward; IFEval's records as they come."""
    from vt.eval.generation import Completion
    lower, comma = "change_case:english_lowercase", "punctuation:no_comma"
    rows = [{"key": 1, "prompt": "Say hi.", "instruction_id_list": [lower, comma], "kwargs": [{}, {}]},
            {"key": 2, "prompt": "Say bye.", "instruction_id_list": [lower], "kwargs": [{"num_words": None}]}]
    data = tmp_path / "if.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hello = "hello there, my friend. how are you doing today? the weather is nice."

    class Gen:
        def generate(self, convs, n, seed, max_new_tokens=None):
            return [[Completion(hello if "hi" in c[-1]["content"] else "BYE", 2, "stop")] for c in convs]
    cfg = EvalConfig(name="if", data=str(data), domain="instruct", ks=(1,), maj_ks=(), progress=False,
                     sampling=SamplerConfig(n=1))
    s = run_eval(cfg, tmp_path / "out", generator=Gen())
    assert s["prompt_strict"] == 0.0 and s["inst_strict"] == pytest.approx(1 / 3) and s["avg@n"] == 0.0


def test_a_failed_run_does_not_block_the_corrected_one(tmp_path, aime_rows, math_reward):
    """A run that failed before its first result (here a wrong --ckpt) leaves config.json behind; the
    corrected re-run into the same --out must not be refused for 'different settings'."""
    from vt.eval.runner import EvalModelConfig
    with pytest.raises(VtError, match="no such checkpoint directory"):
        run_eval(config(model=EvalModelConfig(ckpt=str(tmp_path / "typo"))), tmp_path / "out", reward=math_reward)
    assert (tmp_path / "out" / "config.json").is_file()
    summary = run_eval(config(model=EvalModelConfig(ckpt=str(tmp_path / "right"))), tmp_path / "out",
                       generator=StandIn(aime_rows), reward=math_reward)
    assert summary["problems"] == 30
    # Once results exist the settings guard them: another checkpoint into the same --out is refused.
    with pytest.raises(VtError, match="holds results of different settings"):
        run_eval(config(model=EvalModelConfig(ckpt=str(tmp_path / "other"))), tmp_path / "out",
                 generator=StandIn(aime_rows), reward=math_reward)


def test_wandb_run_holds_the_summary_and_logging_is_not_a_result_setting(tmp_path, aime_rows, math_reward,
                                                                          monkeypatch):
    pytest.importorskip("wandb")
    from testutil import wandb_runs
    from vt.tracking import LoggingConfig
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    summary = run_eval(config(logging=LoggingConfig(wandb_project="vt-test")), tmp_path / "o",
                       generator=StandIn(aime_rows), reward=math_reward)
    (run,) = wandb_runs(tmp_path / "o")
    assert run["job_type"] == "eval" and run["name"] == "aime25" and run["config"]["data"] == str(AIME)
    assert run["summary"]["pass@4"] == summary["pass@4"] and run["summary"]["problems"] == 30
    # W&B off again: the same output directory resumes (logging is not one of the settings results depend on)
    assert run_eval(config(), tmp_path / "o", generator=StandIn(aime_rows), reward=math_reward) == summary


def test_wrong_by_timeout_counts_in_pass_at_k_and_apart_from_verifier_errors():
    """issue 46: an answer whose check timed out is a 0 that stays in pass@k (a verifier error is left out), and
    the summary counts both kinds."""
    from vt.eval.runner import summarize

    def sample(failure, correct):
        return {"failure": failure, "correct": correct, "answer": "a", "finish": "stop", "tokens": 3}

    rows = [{"samples": [sample("timeout", False), sample(None, True), sample("verifier_error", False),
                         sample("timeout", False)], "clusters": [None] * 4}]
    summary = summarize(config(ks=(1,), maj_ks=()), rows)
    assert summary["timeouts"] == 2 and summary["verifier_errors"] == 1
    assert summary["pass@1"] == pytest.approx(1 / 3)
