"""Majority-vote pseudo-labels by hand, multi-path distillation keeps verified traces only, expansion with
a judge, stratification into manifests that vt.data.curriculum reads."""
import argparse
import json
import re

from eval_helpers import math_reward  # noqa: F401 (session fixture)
from vt.data.curriculum import load_pass_rates
from vt.io import ResumableWriter
from vt.datagen.stages import run_stage
from vt.datagen.stratify import StratifyConfig, run_stratify
from vt.datagen.teacher import DistillConfig, distill_batch, expand_batch, majority_label
from vt.eval.answers import math_equivalence


def test_majority_label_hand_cases(math_reward):
    eq = math_equivalence(math_reward)
    # 2, 2, 3, None, \frac{4}{2}: cluster "2" has 3 votes of k = 5 -> 0.6 >= 0.5
    top, votes, clusters = majority_label(["2", "2", "3", None, "\\frac{4}{2}"], 5, 0.5, eq)
    assert (top, votes, clusters) == (0, 3, [0, 0, 1, None, 0])
    # without math equivalence the fraction is its own cluster: 2 votes of 5 < 0.5
    assert majority_label(["2", "2", "3", None, "\\frac{4}{2}"], 5, 0.5)[1] == "no_consensus"
    assert majority_label(["2", "3", "3", "2"], 4, 0.25)[1] == "vote_tie"  # a tie is no label
    assert majority_label([None, None], 2, 0.5)[1] == "no_answer"
    assert majority_label(["7", "7", "1", "2", "3", "4", None, None], 8, 0.25)[:2] == (0, 2)


class Teacher:
    """Replies by looking up the question: scripted answers per question, cycled over calls."""

    def __init__(self, script):
        self.script, self.seen = script, {}

    def __call__(self, conversations):
        out = []
        for conv in conversations:
            q = conv[-1]["content"]
            j = self.seen.get(q, 0)
            self.seen[q] = j + 1
            a = self.script[q][j % len(self.script[q])]
            out.append(RuntimeError("endpoint down") if a == "ERR" else
                       "<think>...</think>No box here." if a is None else f"<think>work</think>So \\boxed{{{a}}}.")
        return out


def test_distill_keeps_verified_traces(tmp_path, math_reward):
    rows = [
        {"id": "ref", "prompt": "What is 6*7?", "ground_truth": "42", "ability": "math"},  # reference check
        {"id": "vote", "prompt": "What is 2+2?", "ability": "math"},  # no reference: vote
        {"id": "tie", "prompt": "Pick 1 or 2.", "ability": "math"},
        {"id": "none", "prompt": "What is 1-1?", "ground_truth": "0", "ability": "math"},
    ]
    teacher = Teacher({"What is 6*7?": ["42", "41", "\\frac{84}{2}", "ERR"],
                       "What is 2+2?": ["4", "4.0", "5", None],
                       "Pick 1 or 2.": ["1", "2", "1", "2"],
                       "What is 1-1?": ["1", "2", "3", None]})
    inp = tmp_path / "seeds.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    step = distill_batch(teacher, DistillConfig(k=4), {"math": math_reward})
    report = run_stage(inp, ResumableWriter(tmp_path / "traces.jsonl"), batch_step=step, batch_size=3, progress=False)
    assert report["counts"] == {"kept": 2, "vote_tie": 1, "no_verified_trace": 1}
    out = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert [r["id"] for r in out] == ["ref/t0", "ref/t2", "vote/t0", "vote/t1"]
    assert out[0]["metadata"] | {} == {"prompt_id": "ref", "pass_rate": 0.5, "rollouts": 4, "label_source": "reference"}
    assert out[2]["ground_truth"] == "4" and out[2]["metadata"]["label_source"] == "vote"
    assert out[2]["messages"][-1] == {"role": "assistant", "content": "<think>work</think>So \\boxed{4}."}


def test_expand_with_judge(tmp_path):
    def teacher(convs):
        out = []
        for c in convs:
            t = c[-1]["content"]
            kind = "skeleton" if "skeleton" in t else "objective"
            seed = re.search(r"Original problem:\n(.*)", t, re.S).group(1)
            out.append(f"<think>hm</think>Problem: {seed} ({kind} variant)")
        return out

    def judge(convs):
        return ["Verdict: BAD" if "B (objective" in c[-1]["content"] else
                "fine" if "C (" in c[-1]["content"] else "Verdict: GOOD" for c in convs]

    inp = tmp_path / "seeds.jsonl"
    inp.write_text("".join(json.dumps({"id": x, "prompt": x}) + "\n" for x in "ABC"))
    step = expand_batch(teacher, ["skeleton", "objective"], judge)
    report = run_stage(inp, ResumableWriter(tmp_path / "x.jsonl"), batch_step=step, batch_size=2, progress=False)
    out = [json.loads(x) for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert [r["id"] for r in out] == ["A/skeleton", "A/objective", "B/skeleton"]
    assert out[0]["prompt"] == [{"role": "user", "content": "A (skeleton variant)"}]
    assert report["counts"] == {"kept": 2, "no_rewrite_kept": 1}
    rej = json.loads((tmp_path / "x.jsonl.rejected.jsonl").read_text())
    assert rej["detail"] == {"skeleton": "judge_unparseable", "objective": "judge_unparseable"}


def test_stratify_manifests(tmp_path):
    traces = []
    for p, (rate, n) in {"p0": (0.125, 8), "p1": (0.5, 8), "p2": (0.0, 8), "p3": (1.0, 4)}.items():
        for t, length in enumerate((800, 6000)):
            traces.append({"id": f"{p}/t{t}", "prompt": "q", "response": "a",
                           "metadata": {"prompt_id": p, "pass_rate": rate, "rollouts": n, "trace_length": length}})
    inp = tmp_path / "traces.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in traces))
    m = run_stratify(str(inp), tmp_path / "cur", StratifyConfig(difficulty_edges=(0.5,), length_edges=(5000,)))
    stage2 = [json.loads(x)["id"] for x in (tmp_path / "cur" / "stage2.jsonl").read_text().splitlines()]
    assert stage2 == ["p0/t1", "p2/t1"]  # error >= 0.75 and >= 5000 tokens; p3 has too few rollouts anyway
    stage1 = [json.loads(x)["id"] for x in (tmp_path / "cur" / "stage1.jsonl").read_text().splitlines()]
    assert stage1[:2] == ["p3/t0", "p3/t1"] and len(stage1) == 8  # easy first (difficulty 0 < 0.5)
    rates = load_pass_rates(tmp_path / "cur" / "pass_rates.jsonl")  # the file SFT stage 2 reads
    assert rates["p0"].pass_rate == 0.125 and rates["p3"].n == 4
    assert {(c["difficulty_bucket"], c["length_bucket"]): c["count"] for c in m["cells"]} == \
        {(0, 0): 1, (0, 1): 1, (1, 0): 3, (1, 1): 3}


def test_vt_data_cli_parses_every_subcommand():
    from vt.datagen import commands
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    for argv in (["filter", "a.jsonl", "b.jsonl"], ["dedup", "a.jsonl", "b.parquet"],
                 ["decontam", "a.jsonl", "b.jsonl", "--eval", "e.parquet"],
                 ["expand", "a.jsonl", "b.jsonl", "--teacher", "openai:http://x|m"],
                 ["judge", "a.jsonl", "b.jsonl", "--judge", "openai:http://x|m"],
                 ["distill", "a.jsonl", "b.jsonl", "--teacher", "ckpt:/c", "--tokenizer", "/t", "-k", "4"],
                 ["stratify", "a.jsonl", "outdir"]):
        assert callable(parser.parse_args(["data", *argv]).func)
