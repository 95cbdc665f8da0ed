"""A verdict for every answer: whatever a solution controls ends in a verdict, and a wrong answer scores 0.

A verifier error (score None) leaves a sample out of its RL group's statistics and out of pass@k, so a
policy that can turn its wrong answers into verifier errors at will is rewarded for it. The host reads
bytes the solution controls in a few places: the stdout of a stdin/stdout test (graded by
``stdout_matches``), the result line of a call test (in call mode the solution shares the harness's
process, so it can write that line itself), the verdict and messages of a program test, and the stderr
of any run (``classify_run``). Here: the issue's reproductions through the sandbox, and properties over
arbitrary bytes for every judging function: it never raises, its details encode as UTF-8, and it never
passes an answer that the rule does not accept.
"""
from __future__ import annotations

import json
import math
import warnings

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from vt.rewards.code.grading import (classify_run, judge_call_result, judge_program_result, loads_result,
                                     stdout_matches, values_equal)
from vt.rewards.code.reward import CodeReward
from vt.rewards.code.tests import CallTest, ProgramTest, StdioTest
from vt.rewards.registry import CodeConfig
from vt.rewards.sandbox.cold import RunResult

NONCE = "0123456789abcdef0123456789abcdef"
KINDS = {"wrong", "timeout", "runtime_error", "output_limit", "memory"}


def block(code: str) -> str:
    return "```python\n" + code + "\n```\n"


def encodable(details: dict) -> bool:
    """Details any writer can write: strict UTF-8 JSON (a lone surrogate fails here)."""
    json.dumps(details, ensure_ascii=False).encode("utf-8")
    return True


@pytest.fixture(scope="module")
def reward():
    with CodeReward(workers=2, test_time_limit_s=10, problem_time_limit_s=30) as r:
        yield r


CALL = {"tests": [{"fn_name": "f", "args": [3], "expected": 6}]}
PROGRAM = {"tests": [{"program": "assert f(3) == 6\n"}]}
STDIO = {"tests": [{"input": "3\n", "output": "6\n"}]}
LCB_STDIO = {"public_test_cases": json.dumps([{"input": "3\n", "output": "6\n", "testtype": "stdin"}])}
LCB_CALL = {"public_test_cases": json.dumps([{"input": "3", "output": "6", "testtype": "functional"}]),
            "metadata": json.dumps({"func_name": "f"})}  # fmt: skip
VERL_CALL = {"reward_model": {"ground_truth": json.dumps({"fn_name": "f", "inputs": [[3]], "outputs": [[6]]})}}
VERL_STDIO = {"reward_model": {"ground_truth": json.dumps({"inputs": ["3\n"], "outputs": ["6\n"]})}}

# The harness prints its result with json.dumps; a solution that replaces it controls the whole line.
FORGE = "import json\njson.dumps = lambda *a, **k: {text!r}\ndef f(x):\n    return 0\n"

CALL_ATTACKS = {
    # the reproductions
    "huge-int": "def f(x):\n    return 10 ** 400",
    "int-past-str-limit": "import sys\nsys.set_int_max_str_digits(0)\ndef f(x):\n    return 10 ** 5000",
    "deep-brackets": FORGE.format(text="[" * 100_000 + "]" * 100_000),
    # others of the same classes
    "nan": FORGE.format(text='{"ok": NaN}'),
    "infinity": FORGE.format(text='{"ok": [Infinity, -Infinity]}'),
    "float-overflow": FORGE.format(text='{"ok": 1e999999999}'),
    "megabyte-int": FORGE.format(text='{"ok": ' + "7" * 1_000_000 + "}"),
    "deep-dict": FORGE.format(text='{"ok": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"),
    "deep-under-limit": FORGE.format(text='{"ok": ' + "[" * 900 + "]" * 900 + "}"),
    "not-utf8": "import json, sys\njson.dumps = lambda *a, **k: '{\"ok\": \"\\udcff\"}'\ndef f(x):\n    return 0\n",
    "error-not-a-string": FORGE.format(text='{"error": ["runtime_error"], "message": [[[' + "9" * 5000 + "]]]}"),
    "message-deep": FORGE.format(text='{"error": "runtime_error", "message": ' + "[" * 5000 + "]" * 5000 + "}"),
    "lone-surrogate": "def f(x):\n    raise ValueError('\\ud800')",
    "forged-surrogate": FORGE.format(text='{"error": "wrong", "message": "\\ud800\\udfff\\ud800"}'),
    "long-line": FORGE.format(text='{"ok": "' + "x" * 4_000_000 + '"}'),
    "not-a-dict": FORGE.format(text="[6]"),
    "underflow": FORGE.format(text='{"ok": 6e-999999999}'),
    "big-negative": "def f(x):\n    return -(10 ** 400)",
    "bool-for-int": "def f(x):\n    return True",
}


@pytest.mark.parametrize("record", [CALL, LCB_CALL, VERL_CALL], ids=["vt", "livecodebench", "verl"])
def test_call_attacks_score_0_never_a_verifier_error(reward, record):
    names = list(CALL_ATTACKS)
    results = reward([record] * (len(names) + 1), [block(CALL_ATTACKS[n]) for n in names] + [block("def f(x):\n    return 2 * x")])
    assert results[-1].score == 1.0, results[-1]
    passed = {n: (r.score, r.failure) for n, r in zip(names, results) if r.score != 0.0}
    assert not passed, passed
    assert all(encodable(r.details) for r in results)
    assert "\\ud800" in results[names.index("lone-surrogate")].details["reason"]


def test_a_forged_line_with_the_right_value_is_only_that_value(reward):
    """In call mode the solution can print the result line itself: it then passes exactly when the value
    it prints is right, as if returned (the value is all it controls)."""
    forged = [FORGE.format(text='{"ok": 6}'), FORGE.format(text='{"ok": 6.0, "ok": 5}'), FORGE.format(text='{"ok": 6.0000000001}')]
    assert [r.score for r in reward([CALL] * 3, [block(c) for c in forged])] == [1.0, 0.0, 1.0]


STDIO_ATTACKS = {
    "huge-exponent": "print('6e999999999')",
    "tiny-exponent": "print('6e-999999999')",
    "exponent-past-decimal": "print('6e9999999999999999999')",
    "snan": "print('sNaN')",
    "nan": "print('NaN')",
    "inf": "print('Infinity')",
    "overflow": "print(1e308 * 10, -1e308)",
    "long-line": "print('6' * 3_000_000)",
    "many-digits-same-value": "print('6.' + '0' * 2_000_000 + '1')",
    "zero-exponent": "print('0e999999999')",
    "unicode-digits": "print('\\u0666')",
    "surrogate-escape": "import sys\nsys.stdout.buffer.write(b'\\xed\\xa0\\x80\\n')",
    "many-lines": "print('6\\n' * 200_000)",
}


@pytest.mark.parametrize(
    "record, source_passes",
    # What the source's own checker passes too: LiveCodeBench reads lines as Decimals, which read any
    # Unicode digit; verl reads a line as one float, 6.0...01 with two million zeros included.
    [(STDIO, set()), (LCB_STDIO, {"unicode-digits"}), (VERL_STDIO, {"many-digits-same-value"})],
    ids=["vt", "livecodebench", "verl"],
)
def test_stdio_attacks_score_0_never_a_verifier_error(reward, record, source_passes):
    names = list(STDIO_ATTACKS)
    results = reward([record] * (len(names) + 1), [block(STDIO_ATTACKS[n]) for n in names] + [block("print(2 * int(input()))")])
    assert results[-1].score == 1.0, results[-1]
    passed = {n for n, r in zip(names, results) if r.score != 0.0}
    assert passed == source_passes, [(n, r) for n, r in zip(names, results) if n in passed ^ source_passes]
    assert all(r.score is not None for r in results)
    assert all(encodable(r.details) for r in results)


def test_program_messages_encode(reward):
    """A program test's failure message carries the solution's exception text: a lone surrogate in it is
    escaped, never written as is."""
    wrong = "def f(x):\n    raise ValueError('\\ud800' * 3)"
    (r,) = reward([PROGRAM], [block(wrong)])
    assert r.score == 0.0 and r.failure == "runtime_error" and encodable(r.details), r
    assert "\\ud800" in r.details["reason"]


# ---- properties over arbitrary bytes ----------------------------------------------------------------

# JSON-ish text: valid JSON, the tokens json.loads accepts beyond JSON, numbers of every size, nesting.
TOKENS = ["NaN", "Infinity", "-Infinity", "1e999999999", "-1e400", "1e-400", "9" * 5000, "-" + "9" * 400, "6", "6.0",
          "6.000000001", "5.999999999", "true", "1", "null", '"6"', '"\\ud800"', '"\\udfff"', "[", "]", "{", "}", ",",
          ":", '"ok"', '"error"', '"message"', '"wrong"', '"memory"', "0e99999", "1E+2", "-0", "-0.0", " "]  # fmt: skip
json_ish = st.lists(st.sampled_from(TOKENS), max_size=30).map("".join)
values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
result_lines = st.one_of(
    st.binary(max_size=200),
    json_ish.map(str.encode),
    st.builds(lambda v: json.dumps({"ok": v}).encode(), values),
    st.builds(lambda t: ('{"ok": ' + t + "}").encode(), json_ish),
    st.builds(lambda n, t: ('{"ok": ' + "[" * n + t + "]" * n + "}").encode(), st.integers(0, 3000), json_ish),
)
stdouts = st.builds(lambda pre, line, post: pre + b"\n" + NONCE.encode() + line + post,
                    st.binary(max_size=50), result_lines, st.sampled_from([b"", b"\n", b"\nmore\n"]))  # fmt: skip


def strict(line: bytes):
    """An independent strict reading of a result line: Python's json.loads refusing what JSON refuses."""
    def no_constant(name):
        raise ValueError(name)

    value = json.loads(line.decode("utf-8"), parse_constant=no_constant)
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("overflow")
        stack.extend(v if isinstance(v, list) else v.values() if isinstance(v, dict) else ())
    return value


def passes(line: bytes, accepted: tuple, grader: str) -> bool:
    try:
        result = strict(line)
    except (ValueError, RecursionError):
        return False
    if not isinstance(result, dict) or "ok" not in result:
        return False
    if grader == "vt":
        return any(values_equal(a, result["ok"], "vt") for a in accepted)
    return any(a == result["ok"] for a in accepted)  # the checkers' own rule: Python's ==


ACCEPTED = [(6,), (6.0,), ([6, "6", None],), ({"a": [1.5, True]},), (10**400,), ([[6]], [6])]


@given(stdout=stdouts, which=st.integers(0, len(ACCEPTED) - 1), grader=st.sampled_from(["vt", "livecodebench", "prime"]))
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": ' + b"1" * 5000 + b"}", which=0, grader="vt")
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", which=2, grader="vt")
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": ' + str(10**400).encode() + b"}", which=4, grader="vt")
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": ' + str(10**400 + 1).encode() + b"}", which=4, grader="prime")
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": true}', which=0, grader="livecodebench")
def test_judge_call_result_never_raises_and_passes_only_accepted_values(stdout, which, grader):
    accepted = ACCEPTED[which]
    verdict = judge_call_result(stdout, NONCE, accepted, grader)
    line = stdout[stdout.rfind(b"\n" + NONCE.encode()) + 1 + len(NONCE) :].split(b"\n", 1)[0]
    assert (verdict is None) == passes(line, accepted, grader), verdict
    if verdict is not None:
        kind, details = verdict
        assert kind in KINDS and encodable(details), verdict


@given(stdout=stdouts)
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": true, "x": 1}')
@example(stdout=b"\n" + NONCE.encode() + b'{"ok": 1}')
@example(stdout=b"\n" + NONCE.encode() + b'{"error": "wrong", "message": "\\ud800"}')
def test_judge_program_result_never_raises(stdout):
    verdict = judge_program_result(stdout, NONCE)
    line = stdout[stdout.rfind(b"\n" + NONCE.encode()) + 1 + len(NONCE) :].split(b"\n", 1)[0]
    try:
        exact = strict(line) == {"ok": True} and type(strict(line)["ok"]) is bool
    except (ValueError, RecursionError):
        exact = False
    assert (verdict is None) == exact, verdict
    if verdict is not None:
        assert verdict[0] in KINDS and encodable(verdict[1]), verdict


def test_loads_result_refuses_what_the_harness_cannot_write():
    for text in [b"NaN", b"[Infinity]", b"-Infinity", b"1e400", b"[" * 100_000, b'"\xff"', b"{"]:
        with pytest.raises(ValueError):
            loads_result(text)
    assert loads_result(b"[1.5, -0, 6]") == [1.5, 0, 6]
    too_long = loads_result(str(10**400).encode())
    assert not values_equal(10**400, too_long) and not values_equal(10**400, too_long, "prime")
    assert loads_result(str(10**400).encode(), int_digits=402) == 10**400  # an accepted value this long
    assert loads_result(b"1" + b"0" * 5000, int_digits=5002) == 10**5000  # past int()'s 4,300 digits


STDIO_TOKENS = ["6", "6.0", "6e0", "0.6e1", "+6", "06", "6.0000001", "sNaN", "NaN", "-nan", "Infinity", "inf",
                "1e999999999", "6e-999999999", "1e9999999999999999999", "0e999999999", "\u0666", "6_0", "0x6", "\ud800",
                "1" * 3000, " ", "\t", "\n", "\r\n", "YES", "\x00", "\u2028", "\x85"]  # fmt: skip
texts = st.one_of(st.lists(st.sampled_from(STDIO_TOKENS), max_size=12).map("".join), st.text(max_size=40))


@given(got=texts, expected=st.sampled_from(["6", "6\n", "6 7\n", "YES\n", "1.5\n2.5\n", "0\n", "inf\n", "nan\n"]),
       grader=st.sampled_from(["vt", "livecodebench", "prime"]))  # fmt: skip
def test_stdout_graders_never_raise(got, expected, grader):
    assert stdout_matches(got, expected, grader) in (True, False)


@given(got=texts)
def test_stdout_graders_pass_only_the_same_numbers(got):
    """Whatever is printed, LiveCodeBench's rule passes "6" only for a line whose one number is 6 and
    vt's only for the text itself."""
    tokens = got.strip().split()
    if stdout_matches(got, "6\n", "livecodebench"):
        assert got.strip() == "6" or (len(got.strip().split("\n")) == 1 and len(tokens) == 1 and float(tokens[0]) == 6)
    if stdout_matches(got, "6\n", "vt"):
        assert got.rstrip() == "6"


@given(stderr=st.binary(max_size=300), returncode=st.sampled_from([0, 1, 2, 128 + 9, 128 + 24, 128 + 25, None]),
       status=st.sampled_from(["exited", "timeout", "output_limit"]))  # fmt: skip
@example(stderr="ValueError: \ud800".encode("utf-8", "surrogatepass"), returncode=1, status="exited")
def test_classify_run_never_raises_and_never_blames_the_verifier(stderr, returncode, status):
    verdict = classify_run(RunResult(status, returncode, b"", stderr, 0.5))
    if verdict is not None:
        assert verdict[0] in KINDS and encodable(verdict[1]), verdict
    else:
        assert status == "exited" and returncode == 0


def test_a_sandbox_that_cannot_start_is_a_verifier_error():
    """The one failure that is the verifier's: the sandbox did not start. It scores None, with its reason."""
    reward = CodeReward.__new__(CodeReward)  # no sandbox: only _run_tests' handling of the run is under test
    reward.config = CodeConfig()
    broken = RunResult("sandbox_error", None, b"", "bwrap: no permission \ud800".encode("utf-8", "surrogatepass"), 0.0)
    for test in (StdioTest("3\n", "6\n"), CallTest("f", [3], 6), ProgramTest("assert f(3) == 6\n")):
        r = reward._run_tests(lambda mode, stdin, limits: broken, [test])
        assert r.score is None and r.failure == "verifier_error" and "bwrap: no permission" in r.details["reason"], r
        assert encodable(r.details)


def test_prime_grading_of_overflowing_numbers_warns_nothing():
    """verl's rule compares lines as floats with numpy: 1e308 against -1e308 overflows inside allclose,
    which must read as "not close", not as a warning (an error where warnings are errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not stdout_matches("1e308\n", "-1e308\n", "prime")
        assert not stdout_matches("1e308\n-1e308\n", "-1e308\n1e308\n", "prime")
        assert stdout_matches("1e308\n", "1.0e308\n", "prime")


numbers_at_the_edges = st.sampled_from([10**400, -(10**400), 2**1024, 2**1024 - 1, 1.7976931348623157e308, 5e-324, 0.0,
                                        -0.0, 2**53 + 1, float(2**53), True, False, 0, 1])  # fmt: skip
edge_values = st.recursive(values | numbers_at_the_edges, lambda inner: st.lists(inner, max_size=3), max_leaves=6)


@given(expected=edge_values, got=edge_values, grader=st.sampled_from(["vt", "livecodebench", "prime"]))
@example(expected=10**400, got=1.7976931348623157e308, grader="vt")
@example(expected=[1.7976931348623157e308], got=[2**1024], grader="vt")
def test_values_equal_never_raises_and_is_exact_on_integers(expected, got, grader):
    verdict = values_equal(expected, got, grader)
    assert verdict in (True, False)
    if type(expected) is int and type(got) is int:
        assert verdict == (expected == got)
    if grader != "vt":
        assert verdict == (expected == got)  # the checkers' own rule: Python's == (no tuples here)
