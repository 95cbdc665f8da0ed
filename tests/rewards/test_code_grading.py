"""stdin/stdout grading as each record's source grades it, checked against the sources' own graders.

LiveCodeBench records are graded by LiveCodeBench's rule and verl / PRIME / APPS records by verl's
prime_code checker; vt's own ``tests`` keep vt's rule (README: "Code reward"). The references are the
graders themselves (``nvidia-livecodebench``'s testing_util and ``verl``'s prime_code testing_util, run
by reference_graders.py in a child process) on generated pairs of printed and expected output: number
spellings, leading and trailing spaces, blank lines, extra or missing lines, words.
"""
from __future__ import annotations

import decimal
import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from vt.rewards.code.formats import code_tests
from vt.rewards.code.grading import judge_call_result, stdout_matches, values_equal
from vt.rewards.code.reward import CodeReward
from vt.rewards.code.tests import StdioTest

from .reference_graders import load

pytest.importorskip("numpy")
REFERENCE = Path(__file__).with_name("reference_graders.py")

NUMBERS = ["3", "3.0", "3.00", "+3", "03", "3e0", "0.3e1", "-0", "0", "0.1", "0.10000001", "0.1000000001",
           "1e-9", "50000000000000000", "50000000000000001", "nan", "inf", "2.5", "2.50000", ".5", "1_000", "1000"]  # fmt: skip
WORDS = ["YES", "yes", "No", "a b", "x", "", "1 2", "1  2", "1\t2"]
PADS = ["", " ", "  ", "\t"]


def random_output(rng: random.Random, numbers: list[str] = NUMBERS) -> str:
    lines = []
    for _ in range(rng.randint(1, 3)):
        k = rng.randint(1, 3)
        tokens = [rng.choice(numbers if rng.random() < 0.75 else WORDS) for _ in range(k)]
        lines.append(rng.choice(PADS) + rng.choice([" ", "  "]).join(tokens) + rng.choice(PADS))
    return "\n".join(lines) + rng.choice(["", "\n", "\n\n", " \n"])


def perturb(text: str, rng: random.Random, numbers: list[str] = NUMBERS) -> str:
    """Another spelling of the same output, or a near miss."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    tokens = lines[i].split()
    choice = rng.random()
    if tokens and choice < 0.5:
        j = rng.randrange(len(tokens))
        tokens[j] = rng.choice(numbers)
        lines[i] = rng.choice(PADS) + " ".join(tokens) + rng.choice(PADS)
    elif choice < 0.7:
        lines.insert(i, rng.choice(["", " "]))
    elif choice < 0.85:
        lines[i] = rng.choice(PADS) + lines[i].strip() + rng.choice(PADS)
    else:
        del lines[i]
    return "\n".join(lines)


def cases(seed: int, n: int, numbers: list[str] = NUMBERS) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        expected = random_output(rng, numbers)
        printed = perturb(expected, rng, numbers) if rng.random() < 0.8 else random_output(rng, numbers)
        pairs.append((printed, expected))
    return pairs


def reference(grader: str, pairs: list) -> list[bool]:
    run = subprocess.run([sys.executable, str(REFERENCE), grader], input=json.dumps(pairs), capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("grader, package", [("livecodebench", "livecodebench"), ("prime", "verl")])
def test_stdout_grading_agrees_with_the_source_grader(grader, package):
    if importlib.util.find_spec(package) is None:  # found, not imported: verl's __init__ wants its full stack
        pytest.skip(f"{package} not installed (the Makefile installs it with --no-deps)")
    pairs = cases(seed={"livecodebench": 1, "prime": 2}[grader], n=400)
    want = reference(grader, pairs)
    got = [stdout_matches(printed, expected, grader) for printed, expected in pairs]
    disagree = [(p, e, w) for (p, e), w, g in zip(pairs, want, got) if w != g]
    assert not disagree, disagree[:10]
    assert 40 <= sum(want) <= 360, sum(want)  # both verdicts are well represented


# Spellings a hostile program prints: exponents past any float or Decimal context, infinities and NaNs in
# every spelling, digits of other scripts, long digit strings. (Not sNaN: LiveCodeBench's checker raises
# comparing it; vt fails it, see test_code_verdicts.py.)
HOSTILE = ["6", "6.0", "1e999999999", "1E-999999999", "1e9999999999999999999", "0e999999999", "Infinity", "-inf",
           "inf", "NaN", "nan", "-nan", "\u0666", "\u0666.\u0660", "\uff16", "6_0", "60", "0x6", "1" * 400,
           "1" * 400 + ".0", "1" * 399 + "2", "6." + "0" * 300 + "1", "1e308", "1.0e308", "-1e308", "5e-324",
           "0", "-0", "0.0"]  # fmt: skip


@pytest.mark.parametrize("grader, package", [("livecodebench", "livecodebench"), ("prime", "verl")])
def test_hostile_spellings_agree_with_the_source_grader(grader, package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed (the Makefile installs it with --no-deps)")
    pairs = cases(seed={"livecodebench": 6, "prime": 7}[grader], n=300, numbers=HOSTILE)
    want = reference(grader, pairs)
    got = [stdout_matches(printed, expected, grader) for printed, expected in pairs]
    disagree = [(p, e, w) for (p, e), w, g in zip(pairs, want, got) if w != g]
    assert not disagree, disagree[:10]
    assert 30 <= sum(want) <= 270, sum(want)


def test_record_shapes_choose_the_grader():
    lcb = {"public_test_cases": json.dumps([{"input": "1\n", "output": "2\n", "testtype": "stdin"}])}
    verl = {"reward_model": {"ground_truth": json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})}}
    own = {"tests": [{"input": "1\n", "output": "2\n"}]}
    assert [code_tests(r, 0)[0].grader for r in (lcb, verl, own)] == ["livecodebench", "prime", "vt"]
    assert StdioTest("1\n", "2\n").grader == "vt"


def block(code: str) -> str:
    return "```python\n" + code + "\n```\n"


def test_correct_solutions_with_another_spelling_score_1_on_livecodebench_records():
    record = {"public_test_cases": json.dumps([
        {"input": "3\n", "output": "1.5\n7\n", "testtype": "stdin"},
        {"input": "4\n", "output": "2.0\n9\n", "testtype": "stdin"},
    ])}  # fmt: skip
    leading_spaces = "n = int(input())\nprint('  ', n / 2)\nprint(' ', 2 * n + 1)"
    float_spelling = "n = int(input())\nprint(f'{n / 2:.6f}')\nprint(f'{2 * n + 1:.1f}')"
    wrong = "n = int(input())\nprint(n / 2)\nprint(2 * n)"
    own = {"tests": json.loads(record["public_test_cases"])}
    with CodeReward(workers=2) as reward:
        scores = [r.score for r in reward([record] * 3 + [own], [block(c) for c in (leading_spaces, float_spelling, wrong, leading_spaces)])]
    assert scores == [1.0, 1.0, 0.0, 0.0]  # vt's own rule keeps leading spaces significant


# ---- call-based tests: the returned value against the expected one ---------------------------------

INTS = [0, 1, -1, 7, 10**9 + 5, 10**9 + 6, 999999999000000000, 999999999999999999, 2**53, 2**53 + 1, 10**30,
        10**30 + 1, -(10**18)]  # fmt: skip
FLOATS = [0.0, -0.0, 0.1, 0.3, 0.1 + 0.2, 1.0, 7.0, 2.5, 1e-10, 1e-9, 1e300, 5e-324, 1e16, 1000000005.0,
          1000000006.0, float(2**53)]  # fmt: skip
OTHER = [True, False, None, "a", "1", "", "True"]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.random()
    if depth < 2 and kind < 0.25:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and kind < 0.32:
        return {rng.choice("abc"): random_value(rng, depth + 1) for _ in range(rng.randint(1, 2))}
    return rng.choice(INTS if kind < 0.6 else FLOATS if kind < 0.9 else OTHER)


def near(value, rng: random.Random):
    """Another value that may or may not pass for ``value``: a neighbour of a number, a number's other
    type, a changed element."""
    if isinstance(value, bool):
        return rng.choice([int(value), float(value), not value, value])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, float(value), value, rng.choice(INTS)])
    if isinstance(value, float):
        return rng.choice([math.nextafter(value, math.inf), value * (1 + 1e-10), value * (1 + 1e-8), value + 1e-12,
                           int(value) if value.is_integer() else value, value, rng.choice(FLOATS)])  # fmt: skip
    if isinstance(value, list) and value:
        i = rng.randrange(len(value))
        return rng.choice([value[:i] + [near(value[i], rng)] + value[i + 1 :], value[:i], value[0], [value]])
    if isinstance(value, dict):
        k = rng.choice(sorted(value))
        return {**value, k: near(value[k], rng)}
    return rng.choice([value, random_value(rng)])


def call_cases(seed: int, n: int) -> list[tuple[str, str]]:
    """(returned, expected) as JSON texts."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        expected = random_value(rng)
        got = near(expected, rng) if rng.random() < 0.85 else random_value(rng)
        pairs.append((json.dumps(got), json.dumps(expected)))
    return pairs


def vt_call_verdicts(source: str, pairs: list) -> list[bool]:
    """vt's verdict on each returned value, as the host judges a harness that printed it, for a record of
    ``source``'s shape with that expected value."""
    verdicts = []
    for returned, expected in pairs:
        if source == "livecodebench":
            record = {"public_test_cases": json.dumps([{"input": "0", "output": expected, "testtype": "functional"}]),
                      "metadata": json.dumps({"func_name": "f"})}  # fmt: skip
        else:  # APPS's list form; verl's checker reads the same values from JSON text
            record = {"reward_model": {"ground_truth": json.dumps({"fn_name": "f", "inputs": [[0]], "outputs": [json.loads(expected)]})}}
        (test,) = code_tests(record, 0)
        assert test.grader == source
        stdout = b"printed\n" + NONCE.encode() + json.dumps({"ok": json.loads(returned)}, allow_nan=False).encode() + b"\n"
        verdicts.append(judge_call_result(stdout, NONCE, (test.expected, *test.alternatives), test.grader) is None)
    return verdicts


NONCE = "0123456789abcdef0123456789abcdef"


def verl_first_element_quirk(returned: str, expected: str) -> bool:
    """verl's checker also passes a value equal to the first element of any expected list ([3, 7] accepts
    3); vt accepts the element only of a one-element list (APPS's wrapping), on purpose."""
    e = json.loads(expected)
    return isinstance(e, list) and len(e) > 1 and json.loads(returned) == e[0]


@pytest.mark.parametrize("grader, package", [("livecodebench", "livecodebench"), ("prime", "verl")])
def test_call_results_agree_with_the_source_checker(grader, package):
    """Integers exactly, floats exactly (both checkers compare with Python's ==), 1 == 1.0, True == 1."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed (the Makefile installs it with --no-deps)")
    pairs = call_cases(seed={"livecodebench": 3, "prime": 4}[grader], n=600)
    pairs += [("1000000005", "1000000006"), ("999999999000000000", "999999999999999999"), ("0.30000000000000004", "0.3"),
              ("[1000000005]", "[1000000006]"), ("3", "3.0"), ("true", "1")]  # fmt: skip
    want = reference(grader + "_call", pairs)
    got = vt_call_verdicts(grader, pairs)
    disagree = [(r, e, w) for (r, e), w, g in zip(pairs, want, got) if w != g]
    if grader == "prime":
        assert all(w and verl_first_element_quirk(r, e) for r, e, w in disagree), disagree[:10]
        disagree = []
    assert not disagree, disagree[:10]
    assert want[-6:] == [False, False, False, False, True, True]
    assert 100 <= sum(want) <= 500, sum(want)  # both verdicts are well represented


def test_vt_call_rule_integers_exact_floats_within_1e_9():
    pairs = call_cases(seed=5, n=2000)
    for returned, expected in pairs:
        got, want = json.loads(returned), json.loads(expected)
        assert values_equal(want, got, "vt") == vt_rule(want, got), (returned, expected)
    assert not values_equal(1000000006, 1000000005) and not values_equal(999999999999999999, 999999999000000000)
    assert not values_equal([2**53 + 1], [2**53]) and values_equal(1000000006, 1000000006.0000001)
    assert values_equal(0.3, 0.1 + 0.2) and not values_equal(0.3, 0.3 + 1e-9) and not values_equal(1, True)
    assert values_equal(2**1024, 2**1024) and not values_equal(2**1024, 1.7976931348623157e308 * 0.999)
    assert values_equal(1.7976931348623157e308, 2**1024)  # within 1e-9: the rule, in exact arithmetic
    assert not values_equal(10**400, 1e300) and not values_equal(1e300, 10**400) and not values_equal(10**400, math.inf)


def vt_rule(e, g) -> bool:
    """vt's documented rule, written out recursively (the values here are shallow)."""
    if isinstance(e, bool) or isinstance(g, bool):
        return type(e) is type(g) and e == g
    if type(e) is int and type(g) is int:
        return e == g
    if isinstance(e, (int, float)) and isinstance(g, (int, float)):
        return abs(e - g) <= max(1e-9 * max(abs(e), abs(g)), 1e-9)
    if isinstance(e, list):
        return isinstance(g, list) and len(e) == len(g) and all(vt_rule(x, y) for x, y in zip(e, g))
    if isinstance(e, dict):
        return isinstance(g, dict) and e.keys() == g.keys() and all(vt_rule(e[k], g[k]) for k in e)
    return type(e) is type(g) and e == g


def test_records_choose_the_call_rule():
    """The same answers through the sandbox: an integer off by one fails everywhere; 0.1 + 0.2 for 0.3
    passes vt's own records only (LiveCodeBench's and verl's checkers compare floats exactly)."""
    def records(expected: str) -> list[dict]:
        return [{"tests": [{"fn_name": "f", "args": [0], "expected": json.loads(expected)}]},
                {"public_test_cases": json.dumps([{"input": "0", "output": expected, "testtype": "functional"}]),
                 "metadata": json.dumps({"func_name": "f"})},
                {"reward_model": {"ground_truth": json.dumps({"fn_name": "f", "inputs": [[0]], "outputs": [[json.loads(expected)]]})}}]  # fmt: skip

    cases = [("1000000006", "1000000005", [0.0] * 3), ("1000000006", "1000000006", [1.0] * 3),
             ("999999999999999999", "999999999000000000", [0.0] * 3), ("0.3", "0.1 + 0.2", [1.0, 0.0, 0.0]),
             ("0.5", "0.5", [1.0] * 3), ("3", "3.0", [1.0] * 3)]  # fmt: skip
    recs, comps, want = [], [], []
    for expected, returned, scores in cases:
        recs += records(expected)
        comps += [block(f"def f(x):\n    return {returned}")] * 3
        want += scores
    with CodeReward(workers=2) as reward:
        assert [r.score for r in reward(recs, comps)] == want


# ---- LiveCodeBench's stdout rule on arbitrary text, against its own line functions (in process) --------

SPACES = [" ", "  ", "\t", "\n", "\n\n", " \n", "\r\n", "\x0b", "\u2028", "\xa0", "\x85", ""]
hostile_text = st.lists(st.sampled_from(HOSTILE + ["sNaN", "-sNaN", "YES", "1 2", "\ud800"] + SPACES), max_size=10).map("".join)


@pytest.fixture(scope="module")
def lcb():
    if importlib.util.find_spec("livecodebench") is None:
        pytest.skip("livecodebench not installed (the Makefile installs it with --no-deps)")
    return load("livecodebench", "evaluation/testing_util.py")


def lcb_verdict(lcb, got: str, expected: str) -> bool:
    """grade_stdio's comparison loop, on its own get_stripped_lines and convert_line_to_decimals; where
    its comparison raises (a signalling NaN) it passes nothing."""
    got_lines, want_lines = lcb.get_stripped_lines(got), lcb.get_stripped_lines(expected)
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        if g == w:
            continue
        ok_g, dg = lcb.convert_line_to_decimals(g)
        ok_w, dw = lcb.convert_line_to_decimals(w)
        try:
            if not (ok_g and ok_w and dg == dw):
                return False
        except decimal.InvalidOperation:
            return False
    return True


@given(got=hostile_text, expected=hostile_text)
@example(got="6 7", expected="6")
@example(got="6\n7", expected="6")
@example(got="6", expected="6\n\n7")
@example(got="sNaN 1", expected="sNaN 2")
@example(got="1e999999999 x", expected="1E+999999999 y")
def test_livecodebench_rule_on_hostile_text(lcb, got, expected):
    assert stdout_matches(got, expected, "livecodebench") == lcb_verdict(lcb, got, expected)
