"""Math reward: real AIME 2025 answers, equivalent forms, hedging, and adversarial inputs."""
from __future__ import annotations

import logging
import os
import threading
import time

import pyarrow.parquet as pq
import pytest

from vt.rewards.base import RewardSpecError, scores_and_mask
from vt.rewards.math_reward import MathReward, boxed_answers, top_level_items
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
        (["6/2", "3"], "3", False),  # the same value twice, written two ways
        (["3, 5"], "3", True),
        (["3 \\text{ or } 5"], "3", True),
        (["3 or 5"], "3", True),
        (["3; 5"], "3", True),
        (["3 \\quad 5"], "3", True),
        (["3 \\text{ or } 3"], "3", False),  # a repeated value names one value
        (["3, 5"], "3, 5", False),  # a set-valued answer: math-verify compares sets
        (["1, 2"], "\\{1, 2\\}", False),  # the ground truth is a set however it is written
        (["(1, 2)"], "(1, 2)", False),  # an interval is one item
        (["1,000"], "1000", False),  # a thousands separator is not a list
        (["f(1, 2)"], "3", False),
        (["\\text{forty}"], "40", False),
        (["1", "2"], "1, 2", True),  # two different boxes for a set are still two answers
    ],
)
def test_hedging_policy(reward, boxes, gold, hedged):
    r = reward.score_one(gold, " and ".join(f"\\boxed{{{b}}}" for b in boxes))
    assert bool(r.details.get("hedged")) == hedged, r
    assert r.score == 0.0 or not hedged


def test_top_level_items_deep_and_wrapped():
    assert top_level_items("(" * 5000 + "3 \\lor 5" + ")" * 5000) == ["3", "5"]  # no recursion, any depth
    assert top_level_items("\\left(3 \\text{ or } 5\\right)") == ["3", "5"]
    assert top_level_items("((1, 2))") == ["((1, 2))"]  # a tuple's commas are its own
    assert top_level_items("|3| + |5|") == ["|3| + |5|"] and top_level_items("3 | 5") == ["3", "5"]


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


@pytest.mark.parametrize("bad", [{"deadline_s": 0}, {"deadline_s": 1e308}, {"deadline_s": float("nan")},
                                 {"verify_timeout_s": 0}, {"verify_timeout_s": 10**6}, {"workers": 0}])
def test_config_out_of_range_is_refused(bad):
    from vt.rewards.registry import MathConfig
    from vt.validation import FieldError

    with pytest.raises(FieldError, match=f"MathConfig.{next(iter(bad))}: must be"):
        MathConfig(**bad)


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
    with pytest.raises(RewardSpecError, match="record 0: field 'ground_truth' is nan, not a finite number"):
        reward([{"ground_truth": float("nan")}], ["\\boxed{1}"])
    with pytest.raises(RewardSpecError, match="completion must be a string"):
        reward([{"ground_truth": 1}], [None])


# ---- adversarial inputs ------------------------------------------------------------------------------

ADVERSARIAL = {
    "tower": "\\boxed{10^{10^{10^{10}}}}",
    "megabyte_of_boxes": "\\boxed{1}" * ((1 << 20) // 9),
    "million_open_braces": "\\boxed{" + "{" * 1_000_000,
    "deep_nesting": "\\boxed{" + "{" * 700 + "1" + "}" * 700 + "}",
    "factorial_tower": "\\boxed{(10^{10^{8}})!}",
    # the host's split of a box into the values it names: nested 990 deep (was a RecursionError, a verifier
    # error), long runs of spaces and of separators
    "deep_parentheses": "\\boxed{" + "(" * 990 + "1 \\lor 2" + ")" * 990 + "}",
    "spaces": "\\boxed{1" + " " * 1980 + "2}",
    "separators": "\\boxed{" + "1 \\lor " * 240 + "2}",
}


def _check_adversarial(reward, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    t0 = time.monotonic()
    results = reward([{"ground_truth": 70}] * len(ADVERSARIAL), list(ADVERSARIAL.values()))
    elapsed = time.monotonic() - t0
    for name, r in zip(ADVERSARIAL, results):
        assert r.score == 0.0, (name, r)  # a verdict, never a verifier error (issue 46)
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


# issue 46 item 3: answers that made the check time out (or raise) were verifier errors, left out of RL's group
# statistics and eval's pass@k; a wrong answer chose a verifier error at will.
HOSTILE = {
    "tower9": "\\boxed{9^{9^{9^{9}}}}",
    "factorial": "\\boxed{10000000!}",
    "parentheses300": "\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}",
    "tower10": ADVERSARIAL["tower"],
    "factorial_tower": ADVERSARIAL["factorial_tower"],
    "deep_nesting": ADVERSARIAL["deep_nesting"],
    "power": "\\boxed{2^{2^{40}}}",
}


def test_an_answer_the_check_cannot_finish_is_wrong_not_a_verifier_error(reward):
    res = reward([{"ground_truth": 70}] * len(HOSTILE), list(HOSTILE.values()))
    for name, r in zip(HOSTILE, res):
        assert r.score == 0.0 and r.failure in ("timeout", "wrong", "format"), (name, r)
    assert sum(r.failure == "timeout" for r in res) >= 5, res  # counted apart from wrong answers and errors
    scores, valid = scores_and_mask(res + reward([{"ground_truth": 70}], ["\\boxed{70}"]))
    assert valid.all() and scores.tolist() == [0.0] * len(HOSTILE) + [1.0]


def test_an_answer_that_outlasts_the_deadline_is_a_timeout():
    """math-verify's own timeout off (30 s): the worker is killed at the host's deadline; the ground truth alone
    checks in a fresh worker, so the answer did it: 0, failure timeout."""
    with MathReward(workers=1, deadline_s=2.0, verify_timeout_s=30) as r:
        res = r.score_one("70", HOSTILE["tower9"])
        assert res.score == 0.0 and res.failure == "timeout" and "deadline" in res.details["reason"], res
        assert r.pool.replaced == 1
        assert r.score_one("70", "\\boxed{70}").score == 1.0  # the slot works again


FAKE_WORKER = """
import json, os, sys, time
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if os.environ.get("FAKE_MODE") == "hang" or (req["pred"] or "").startswith("hang"):
        time.sleep(60)
    if req["pred"] is None:
        print(json.dumps({"gold_ok": True}), flush=True)
        continue
    if req["pred"] == "die" or (req["pred"] == "die once" and not os.path.exists(os.environ["FAKE_MARK"])):
        open(os.environ["FAKE_MARK"], "w").close()
        os._exit(9)
    print(json.dumps({"verified": True, "gold_parsed": req["gold"], "pred_parsed": req["pred"]}), flush=True)
"""


@pytest.fixture()
def fake_math(tmp_path, monkeypatch):
    """A MathReward whose workers run FAKE_WORKER: the host's handling of deaths and deadlines, exactly."""
    (tmp_path / "vt_test_fake_math_worker.py").write_text(FAKE_WORKER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_MARK", str(tmp_path / "died"))
    r = MathReward(workers=1, deadline_s=1.0)
    r.pool.close()
    r.pool = WorkerPool("vt_test_fake_math_worker", size=1, startup_timeout_s=30)
    yield r
    r.close()


def test_a_worker_that_dies_on_the_answer_twice_is_a_wrong_answer(fake_math):
    res = fake_math.score_one("1", "\\boxed{die}")
    assert res.score == 0.0 and res.failure == "wrong" and "killed its worker" in res.details["reason"], res


def test_a_worker_that_dies_once_gets_its_verdict_from_the_retry(fake_math):
    assert fake_math.score_one("1", "\\boxed{die once}").score == 1.0


def test_a_deadline_missed_on_the_answer_is_a_timeout(fake_math):
    res = fake_math.score_one("1", "\\boxed{hang}")
    assert res.score == 0.0 and res.failure == "timeout", res


def test_verifier_errors_only_when_the_verifier_cannot_run(fake_math, monkeypatch, reward):
    """None only where the answer is not the cause: the ground truth alone misses the deadline too, workers that
    cannot start, a ground truth math-verify extracts nothing from."""
    monkeypatch.setenv("FAKE_MODE", "hang")
    res = fake_math.score_one("1", "\\boxed{1}")
    assert res.is_verifier_error and res.score is None and "ground truth alone" in res.details["reason"], res
    broken = MathReward(workers=1)
    broken.pool.close()
    broken.pool = WorkerPool("vt_test_no_such_module", size=1, startup_timeout_s=30)
    try:
        res = broken.score_one("1", HOSTILE["tower9"])
        assert res.is_verifier_error and "exited" in res.details["reason"], res
    finally:
        broken.close()
    res = reward([{"ground_truth": "}{"}, {"ground_truth": 70}], ["\\boxed{1}", "\\boxed{70}"])
    scores, valid = scores_and_mask(res)
    assert res[0].is_verifier_error and res[0].score is None and "gold_unparseable" in res[0].details["reason"]
    assert valid.tolist() == [False, True] and scores.tolist() == [0.0, 1.0]


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


# issue 46 item 8: an answer naming two different values was scored by one of them (math-verify reads the last
# of "2 \lor 3", "2 \\ 3", the right side of "2 = 3").
HEDGES = ["\\boxed{3} \\boxed{5}", "\\boxed{3 \\text{ or } 5}", "\\boxed{3 = 5}", "\\boxed{3 \\lor 5}",
          "\\boxed{3 \\vee 5}", "\\boxed{3 \\\\ 5}", "\\boxed{3 \\\\[2pt] 5}", "\\boxed{\\begin{cases}3\\\\5\\end{cases}}",
          "\\boxed{\\begin{aligned}3\\\\5\\end{aligned}}", "\\boxed{3 \\newline 5}", "\\boxed{3 \\cup 5}",
          "\\boxed{3 \\text{, } 5}", "\\boxed{3 \\textbf{ or } 5}", "\\boxed{3 \\text{or} 5}", "\\boxed{(3 \\lor 5)}",
          "\\boxed{3 \\text{ cm or } 5 \\text{ cm}}", "\\boxed{x = 3 = 5}", "\\boxed{3 \\text{ or } \\boxed{5}}",
          "\\boxed{3 \\; 5}", "\\boxed{3 \\land 5}",
          # math-verify keeps the last of two values joined by an arrow, a relation or a space
          "\\boxed{3 \\mid 5}", "\\boxed{3 \\Rightarrow 5}", "\\boxed{3 \\implies 5}", "\\boxed{3 \\to 5}",
          "\\boxed{3 ~ 5}", "\\boxed{3 \\hspace{1em} 5}", "\\boxed{3 \\hbox{or} 5}", "\\boxed{3 \\textsf{ or } 5}",
          "\\boxed{3 | 5}", "\\boxed{5 (\\text{or } 3)}", "\\boxed{3 \\iff 5}", "\\boxed{3 \\sim 5}", "\\boxed{3 \\vert 5}",
          "\\boxed{3 \\dots 5}", "\\boxed{3 \\atop 5}", "\\boxed{3 \\enspace 5}", "\\boxed{3 \\ \\text{or} \\ 5}",
          "\\boxed{3 \\equiv 5}"]


@pytest.mark.parametrize("gold", ["3", "5"])
def test_an_answer_naming_two_values_is_a_hedge(reward, gold):
    res = reward([{"ground_truth": gold}] * len(HEDGES), [f"</think>{h}" for h in HEDGES])
    bad = [(h, r) for h, r in zip(HEDGES, res) if not (r.score == 0.0 and r.failure == "format" and r.details["hedged"])]
    assert bad == []


@pytest.mark.parametrize("gold, answer", [
    ("3", "x = 3"), ("3", "6/2 = 3"), ("3", "3 \\text{ or } 3"), ("3", "\\frac{6}{2}, 3"), ("5", "2 + 3 = 5"),
    ("\\frac{1}{2}", "0.5 = \\frac{1}{2}"), ("3, 5", "5 \\text{ or } 3"), ("(1, 2)", "(1, 2)"),
    ("x = 3", "x = 3"), ("2x + 1", "f(x) = 2x + 1"), ("1000", "1,000"), ("5", "|-5|"), ("55", "1 + 2 + \\dots + 10 = 55"),
    ("5", "\\left|-5\\right|"), ("3", "x \\to 3"),
])
def test_one_value_named_in_several_ways_is_not_a_hedge(reward, gold, answer):
    from math_verify import parse, verify

    assert verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{answer}}}"))  # the oracle agrees it is right
    r = reward.score_one(gold, f"\\boxed{{{answer}}}")
    assert r.score == 1.0, r


# Differential: the hedging policy must not cost a right answer. Answers written the ways models write them (a name,
# units, a computation, the same value twice, sets and intervals for set-valued ground truths): vt's verdict is
# math-verify's on every one.
AGREEMENT = [
 ("\\frac{1}{2}", ["0.5", "1/2", "\\dfrac12", "\\frac{1}{2} \\text{ or } 0.5", "\\left(\\frac{1}{2}\\right)", "P = \\frac{1}{2}", "\\frac{2}{4} = \\frac{1}{2}"]),
 ("2\\sqrt{3}", ["\\sqrt{12}", "2 \\sqrt 3", "x = 2\\sqrt{3}", "2\\sqrt{3} \\approx 3.46"]),
 ("3\\pi", ["3 \\pi", "\\pi \\cdot 3", "3\\pi \\text{ cm}^2", "A = 3\\pi"]),
 ("1000", ["10^{3}", "1000", "1,000", "1{,}000", "1000 \\text{ dollars}", "\\$1000"]),
 ("5", ["x = 5", "n = 5", "a_1 = 5", "f(2) = 5", "5 \\text{ cm}", "5\\,\\text{cm}", "5^\\circ", "5\\%", "5 \\text{ (since } 2+3=5)", "5 \\text{ and } 5", "(5)", "\\{5\\}", "5.0", "\\text{The answer is } 5", "5 \\text{ units}", "5~\\text{cm}", "|{-5}|", "\\sqrt{25}", "2 + 3 = 5", "x=5 \\text{ (the only solution)}"]),
 ("\\frac{\\sqrt{3}}{2}", ["\\cos(30^\\circ) = \\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt 3}{2}", "\\sin 60^\\circ = \\frac{\\sqrt{3}}{2}"]),
 ("0", ["e^{i\\pi} + 1 = 0", "0", "x = 0"]),
 ("2x+1", ["2x + 1", "1 + 2x", "y = 2x + 1", "f(x) = 2x + 1", "2x+1, \\text{ for all } x"]),
 ("\\infty", ["\\infty", "+\\infty"]),
 ("3+4i", ["3+4i", "4i + 3", "z = 3 + 4i"]),
 ("-\\frac{1}{2}", ["-\\frac{1}{2}", "-0.5", "\\frac{-1}{2}", "x = -\\frac12"]),
 ("12", ["12", "12 \\text{ ways}", "\\binom{4}{2} \\cdot 2 = 12", "4! / 2 = 12", "12 \\quad \\text{(ways)}", "\\text{12}"]),
 ("\\frac{\\pi}{4}", ["\\frac{\\pi}{4}", "\\pi/4", "\\theta = \\frac{\\pi}{4}", "\\frac{\\pi}{4} \\text{ radians}"]),
 ("3, 5", ["3, 5", "5, 3", "3 \\text{ and } 5", "x = 3 \\text{ or } x = 5", "\\{3, 5\\}", "x \\in \\{3, 5\\}"]),
 ("(1, 2)", ["(1, 2)", "(1,2)"]),
 ("[1, 2)", ["[1, 2)", "1 \\le x < 2"]),
 ("(-\\infty, 1) \\cup (2, \\infty)", ["(-\\infty, 1) \\cup (2, \\infty)", "x < 1 \\text{ or } x > 2"]),
 ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", ["\\begin{pmatrix}1\\\\2\\end{pmatrix}"]),
 ("x = 3", ["x = 3", "3"]),
 ("y = 2x + 3", ["y = 2x + 3", "y = 3 + 2x"]),
 ("42", ["42", "042", "4 \\cdot 10 + 2 = 42", "42.", "42 \\; \\text{apples}", "\\mathbf{42}", "\\textbf{42}"]),
]


@pytest.mark.parametrize("gold, answers", AGREEMENT, ids=[g for g, _ in AGREEMENT])
def test_answers_written_many_ways_agree_with_math_verify(reward, gold, answers):
    from math_verify import parse, verify

    got = [reward.score_one(gold, f"The final answer is $\\boxed{{{a}}}$.").score for a in answers]
    want = [float(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{a}}}"))) for a in answers]
    assert got == want, [(a, g, w) for a, g, w in zip(answers, got, want) if g != w]
    assert sum(want) >= len(answers) - 3  # most are right: the test is about right answers


@pytest.mark.parametrize("gold, answer", [
    ("5", "\\text{3} \\lor 5"), ("5", "3 \\lor \\text{5}"), ("5", "three \\lor 5"), ("3", "five \\text{ or } 3"),
    ("\\text{Tuesday}", "\\text{Monday} \\lor \\text{Tuesday}"), ("3", "\\pi \\lor 3"), ("3", "x \\lor 2 \\lor 3"),
])
def test_a_value_written_as_text_a_word_or_a_symbol_still_counts(reward, gold, answer):
    """Words beside a number are left out ("5, done"), names before a value too ("x \\to 3"): neither may hide the
    other value of a hedge."""
    r = reward.score_one(gold, f"\\boxed{{{answer}}}")
    assert r.score == 0.0 and r.details.get("hedged"), r
