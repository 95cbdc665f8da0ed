"""Math reward: real AIME 2025 answers, equivalent forms, hedging, and adversarial inputs."""
from __future__ import annotations

import logging
import os
import threading
import time

import pyarrow.parquet as pq
import pytest

from vt.rewards.base import RewardSpecError, scores_and_mask
from vt.rewards.math_reward import MathReward, boxed_answers, hedge_reason, top_level_items
from vt.rewards.workers import WorkerError, WorkerPool

from .conftest import ASSETS

DEADLINE_S = 6.0


@pytest.fixture(scope="module")
def reward():
    with MathReward(workers=2, deadline_s=DEADLINE_S, verify_timeout_s=2) as r:
        yield r


@pytest.fixture(scope="module")
def aime():
    rows = pq.read_table(ASSETS / "aime25.parquet").to_pylist()
    assert len(rows) == 30
    return [{"reward_model": row["reward_model"], "prompt": row["prompt"]} for row in rows]


def as_model(answer: str) -> str:
    return f"<think>Let me compute. Maybe \\boxed{{12345}}? No.</think>\nThe final answer is $\\boxed{{{answer}}}$."


# ---- extraction ----------------------------------------------------------------------------------


def test_boxed_answers_balanced_braces():
    assert boxed_answers(r"\boxed{\frac{1}{2}} and \boxed{x^{2}}") == [r"\frac{1}{2}", "x^{2}"]
    assert boxed_answers(r"\boxed{\{1, 2\}}") == [r"\{1, 2\}"]  # \{ \} are literal, not grouping
    assert boxed_answers(r"\boxed{{{1}") == []  # unbalanced: skipped
    assert boxed_answers(r"\boxed{1} \boxed{2") == ["1"]
    assert boxed_answers(r"\fbox{7}") == ["7"]


@pytest.mark.parametrize(
    "boxes, gold, hedged",
    [
        (["3", "5"], "3", True),
        (["3", " 3 "], "3", False),  # the same answer twice is a commitment, not a hedge
        (["3, 5"], "3", True),
        (["3 \\text{ or } 5"], "3", True),
        (["3 or 5"], "3", True),
        (["3; 5"], "3", True),
        (["3 \\quad 5"], "3", True),
        (["3, 5"], "3, 5", False),  # a set-valued answer: math-verify compares sets
        (["(1, 2)"], "(1, 2)", False),  # an interval is one item
        (["1,000"], "1000", False),  # a thousands separator is not a list
        (["f(1, 2)"], "3", False),
        (["\\text{forty}"], "40", False),
    ],
)
def test_hedging_policy(boxes, gold, hedged):
    assert (hedge_reason(boxes, gold) is not None) == hedged


def test_top_level_items():
    assert top_level_items("3, 5") == ["3", "5"]
    assert top_level_items("\\{3, 5\\}") == ["\\{3, 5\\}"]
    assert top_level_items("x = 3 \\text{ and } y = 4") == ["x = 3", "y = 4"]


# ---- real data -------------------------------------------------------------------------------------


def test_every_aime25_answer_scores_one(reward, aime):
    golds = [row["reward_model"]["ground_truth"] for row in aime]
    results = reward(aime, [as_model(str(g)) for g in golds])
    assert [r.score for r in results] == [1.0] * 30, [r for r in results if r.score != 1.0]


def test_wrong_and_hedged_aime25_answers_score_zero(reward, aime):
    golds = [int(row["reward_model"]["ground_truth"]) for row in aime]
    wrong = reward(aime, [as_model(str(g + 1)) for g in golds])
    assert all(r.score == 0.0 and r.failure == "wrong" for r in wrong), wrong
    hedges = [as_model(f"{g} \\text{{ or }} {g + 1}") for g in golds[:10]]
    hedges += [as_model(f"{g + 1}, {g}") for g in golds[10:20]]
    hedges += [as_model(str(g)) + f" Or maybe \\boxed{{{g + 2}}}." for g in golds[20:]]
    hedged = reward(aime, hedges)
    assert all(r.score == 0.0 and r.failure == "format" and r.details["hedged"] for r in hedged), hedged


def test_answer_inside_thinking_does_not_count(reward):
    r = reward([{"ground_truth": 70}], ["<think>\\boxed{70}</think> I am not sure."])[0]
    assert r.score == 0.0 and r.failure == "format"


def test_only_the_tail_is_scored():
    with MathReward(workers=1, tail_chars=100) as r:
        res = r([{"ground_truth": 70}] * 2, ["\\boxed{70}" + " filler" * 50, "filler " * 50 + "\\boxed{70}"])
    assert [x.score for x in res] == [0.0, 1.0]


@pytest.mark.parametrize(
    "gold, pred, expected",
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("\\frac{1}{2}", "1/2", 1.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("1/2", "\\dfrac{1}{2}", 1.0),
        ("\\frac{1}{2}", "0.51", 0.0),
        ("\\sqrt{2}", "2^{1/2}", 1.0),
        ("70", "070", 1.0),
        (70, "70.0", 1.0),
        ("3, 5", "5, 3", 1.0),  # sets are unordered
        ("\\pi", "3.14", 0.0),
    ],
)
def test_equivalent_forms_follow_math_verify(reward, gold, pred, expected):
    from math_verify import parse, verify

    assert verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{pred}}}")) == bool(expected)  # the oracle
    r = reward([{"ground_truth": gold}], [f"</think>\\boxed{{{pred}}}"])[0]
    assert r.score == expected, r


def test_dataset_errors_name_the_record(reward):
    with pytest.raises(RewardSpecError, match="record 1: missing field 'ground_truth'"):
        reward([{"ground_truth": 1}, {"answer": 2}], ["a", "b"])
    with pytest.raises(RewardSpecError, match="record 0: field 'ground_truth' must be"):
        reward([{"ground_truth": None}], ["a"])
    with pytest.raises(RewardSpecError, match="completion must be a string"):
        reward([{"ground_truth": 1}], [None])


# ---- adversarial inputs ------------------------------------------------------------------------------

ADVERSARIAL = {
    "tower": "\\boxed{10^{10^{10^{10}}}}",
    "megabyte_of_boxes": "\\boxed{1}" * ((1 << 20) // 9),
    "million_open_braces": "\\boxed{" + "{" * 1_000_000,
    "deep_nesting": "\\boxed{" + "{" * 700 + "1" + "}" * 700 + "}",
    "factorial_tower": "\\boxed{(10^{10^{8}})!}",
}


def _check_adversarial(reward, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    t0 = time.monotonic()
    results = reward([{"ground_truth": 70}] * len(ADVERSARIAL), list(ADVERSARIAL.values()))
    elapsed = time.monotonic() - t0
    for name, r in zip(ADVERSARIAL, results):
        assert r.score == 0.0 or r.is_verifier_error, (name, r)
        assert len(repr(r.details)) < 2000, name  # details never echo a megabyte
    # Two workers, five items, each bounded by the deadline (plus scheduling slack on a shared box).
    assert elapsed < 3 * DEADLINE_S + 10
    out, err = capfd.readouterr()
    assert len(caplog.text) + len(out) + len(err) < 10_000
    return results


def test_adversarial_inputs_return_in_time_from_main_thread(reward, caplog, capfd):
    _check_adversarial(reward, caplog, capfd)


def test_adversarial_inputs_return_in_time_from_a_worker_thread(reward, caplog, capfd):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", _check_adversarial(reward, caplog, capfd)))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive() and len(box["r"]) == len(ADVERSARIAL)


def test_verifier_errors_are_not_zeros(reward):
    res = reward([{"ground_truth": 70}, {"ground_truth": 70}], ["\\boxed{70}", ADVERSARIAL["tower"]])
    scores, valid = scores_and_mask(res)
    assert res[1].is_verifier_error and res[1].score is None
    assert valid.tolist() == [True, False] and scores.tolist() == [1.0, 0.0]


# ---- the worker pool's hard deadline -------------------------------------------------------------

HANGING_WORKER = """
import json, sys
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req.get("hang"):
        x = 10 ** (10 ** 9)  # C code: no signal handler can interrupt this
    if req.get("die"):
        sys.exit(3)
    print(json.dumps({"echo": req["n"]}), flush=True)
"""


@pytest.fixture()
def hanging_pool(tmp_path, monkeypatch):
    (tmp_path / "vt_test_hanging_worker.py").write_text(HANGING_WORKER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    pool = WorkerPool("vt_test_hanging_worker", size=1, startup_timeout_s=30)
    yield pool
    pool.close()


def test_pool_kills_and_replaces_a_worker_stuck_in_c_code(hanging_pool):
    assert hanging_pool.call({"n": 1}, 5) == {"echo": 1}
    pid = next(iter(hanging_pool._all)).proc.pid
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="deadline"):
        hanging_pool.call({"n": 2, "hang": True}, 1.0)
    assert time.monotonic() - t0 < 3
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, not left running
    assert hanging_pool.call({"n": 3}, 30) == {"echo": 3}  # a fresh worker took its slot
    assert hanging_pool.replaced == 1


def test_pool_reports_a_dead_worker(hanging_pool):
    with pytest.raises(WorkerError, match="exited"):
        hanging_pool.call({"n": 1, "die": True}, 5)
    assert hanging_pool.call({"n": 2}, 30) == {"echo": 2}


def test_math_verify_runs_in_worker_processes(reward):
    reward([{"ground_truth": 1}], ["\\boxed{1}"])
    pids = {w.proc.pid for w in reward.pool._all}
    assert pids and os.getpid() not in pids
    assert all(w.proc.poll() is None for w in reward.pool._all)
