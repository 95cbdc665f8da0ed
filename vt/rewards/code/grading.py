"""Grading: the host half of the harness protocol. What a test sends into the sandbox (``run_test``), how a run
ended (``classify_run``), and the verdict on what it wrote, by the rules of the record's source (a test's
``grader``: "vt", "livecodebench", "prime"; ``stdout_matches``, ``values_equal``). The harness's result line is
JSON the solution may control, read strictly (``loads_result``): whatever it holds ends in a verdict, never in
an exception. The sandbox's half is sandbox/inside/harness.py (and the warm server, sandbox/inside/pool_server.py).

A new grading rule: a name for ``grader`` and its branch in ``stdout_matches`` / ``values_equal``; a new test
kind's request and verdict: ``run_test`` (see tests.py for the other places).
"""
from __future__ import annotations

import decimal
import fractions
import json
import math
import re
import secrets
import signal
import sys
from typing import Any

import numpy as np

from vt.rewards.base import clip
from vt.rewards.code.tests import CodeTest, ProgramTest, StdioTest
from vt.rewards.sandbox.cold import Limits, RunResult


def run_test(execute, test: CodeTest, limits: Limits) -> tuple[str, dict] | None:
    """One test: its request to the harness, run by ``execute(mode, stdin, limits) -> RunResult`` (one sandboxed
    run of the solution), and its verdict: None if it passed, else (failure kind, details)."""
    if isinstance(test, StdioTest):
        run = execute(test.mode, test.input.encode(), limits)
        bad = classify_run(run)
        if bad is not None:
            return bad
        got = run.stdout.decode("utf-8", errors="replace")
        if not stdout_matches(got, test.output, test.grader):
            return "wrong", {"reason": "output differs", "stdout": _detail("\n".join(normalise_stdout(got)))}
        return None
    nonce = secrets.token_hex(16)
    if isinstance(test, ProgramTest):
        request = json.dumps({"nonce": nonce, "setup": test.setup, "test": test.test, "expose": test.exposed,
                              "entry": list(test.entry)})  # fmt: skip
        run = execute(test.mode, request.encode(), limits)
        return classify_run(run) or judge_program_result(run.stdout, nonce)
    request = json.dumps({"nonce": nonce, "fn_name": test.fn_name, "args": test.args})
    run = execute(test.mode, request.encode(), limits)
    bad = classify_run(run)
    if bad is not None:
        return bad
    return judge_call_result(run.stdout, nonce, (test.expected, *test.alternatives), test.grader)


def normalise_stdout(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdout_matches(got: str, expected: str, grader: str = "vt") -> bool:
    """Whether a program's stdout passes, by the rule of the record's source:

    - "vt" (vt's own ``tests``): equal lines after stripping trailing whitespace and trailing blank lines;
    - "livecodebench" (LiveCodeBench's grader): the whole output stripped, split on newlines, every line
      stripped; as many lines as expected, and each equal as text or, both read as whitespace-separated
      numbers, equal as lists of Decimals (so "1.0" == "1", "1e2" == "100", never 0.1 == 0.1000001);
    - "prime" (verl's prime_code / APPS checker): the stripped outputs equal (also with every line
      stripped), or the non-empty lines equal the expected non-empty lines stripped, or, unless every
      line pair is digits only, each line read as one float and all close (numpy's allclose: rtol 1e-5,
      atol 1e-8).
    """
    if grader == "livecodebench":
        return _livecodebench_match(got, expected)
    if grader == "prime":
        return _prime_match(got, expected)
    return normalise_stdout(got) == normalise_stdout(expected)


def _livecodebench_match(got: str, expected: str) -> bool:
    """LiveCodeBench's grade_stdio, with its verdict on every output, in work bounded by the expected
    output's size: line counts and token counts are compared before anything is converted (its checker
    makes a Decimal of every token of a line first: 8 million tokens, seconds and a gigabyte on the host),
    and tokens are compared pair by pair (the same verdict: equal lists of Decimals, every token read)."""
    want_lines = [line.strip() for line in expected.strip().split("\n")]
    got = got.strip()
    if got.count("\n") + 1 != len(want_lines):
        return False
    for g, w in zip((line.strip() for line in got.split("\n")), want_lines):
        if g == w:
            continue
        got_tokens, want_tokens = g.split(), w.split()
        if len(got_tokens) != len(want_tokens):
            return False
        for a, b in zip(got_tokens, want_tokens):
            try:
                if decimal.Decimal(a) != decimal.Decimal(b):
                    return False
            except (decimal.InvalidOperation, ValueError):  # not a number, or a signalling NaN compared
                return False
    return True


def _prime_match(got: str, expected: str) -> bool:
    lines = got.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(x.strip() for x in lines).strip() == want:
        return True
    want_lines = [x.strip() for x in expected.split("\n") if x]
    if lines == [expected] or lines == want_lines:
        return True
    lines = [x for x in lines if x]
    if lines == want_lines:
        return True
    if all(g.isdigit() and w.isdigit() for g, w in zip(lines, want_lines)):
        return False  # integers compare as text only
    if len(lines) != len(want_lines):
        return False  # (the checker converts every line first: the same verdict)
    try:
        got_f, want_f = [float(x) for x in lines], [float(x) for x in want_lines]
    except ValueError:
        return False
    with np.errstate(all="ignore"):  # 1e308 - -1e308 overflows to inf: not close, and no warning
        return bool(np.allclose(got_f, want_f))


def values_equal(expected: Any, got: Any, grader: str = "vt") -> bool:
    """Whether a call's returned value ``got`` (as the host decoded it from JSON: see ``loads_result``)
    passes for ``expected``, by the rule of the record's source:

    - "vt" (vt's own ``tests``): structurally equal; two integers (never a bool) exactly; where either
      side is a float, within 1e-9 relative or 1e-9 absolute; a bool equals only a bool;
    - "livecodebench" (LiveCodeBench's grade_call_based) and "prime" (verl's prime_code / APPS checker):
      Python's ``==`` on the values, as both checkers compare: integers and floats exactly, ``1 == 1.0``,
      ``True == 1``. (Their checkers see the value itself; here it has crossed JSON, so a tuple anywhere
      reads as a list, where they turn only a returned tuple into a list.)

    Never raises, whatever ``got`` is (iterative, so no depth is too deep; an integer past float's range
    compares in exact arithmetic).
    """
    scalar_equal = _vt_scalar_equal if grader == "vt" else _python_scalar_equal
    stack = [(expected, got)]
    while stack:
        e, g = stack.pop()
        if isinstance(e, (list, tuple)):
            if type(g) is not list or len(e) != len(g):
                return False
            stack.extend(zip(e, g))
        elif isinstance(e, dict):
            if type(g) is not dict or e.keys() != g.keys():
                return False
            stack.extend((e[k], g[k]) for k in e)
        elif type(g) in (list, dict) or not scalar_equal(e, g):
            return False
    return True


def json_equal(expected: Any, got: Any) -> bool:
    """vt's own rule (``values_equal``'s "vt")."""
    return values_equal(expected, got, "vt")


_SCALARS = (type(None), bool, int, float, str)


def _python_scalar_equal(e: Any, g: Any) -> bool:
    return type(g) in _SCALARS and type(e) in _SCALARS and e == g


def _vt_scalar_equal(e: Any, g: Any) -> bool:
    if isinstance(e, bool) or isinstance(g, bool):
        return type(e) is type(g) and e == g
    if type(e) is int and type(g) is int:
        return e == g
    if isinstance(e, (int, float)) and isinstance(g, (int, float)):
        return _close(e, g)
    return type(g) in _SCALARS and type(e) is type(g) and e == g


_REL_TOL = _ABS_TOL = 1e-9


def _close(a: int | float, b: int | float) -> bool:
    """math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), also where an integer is past float's range."""
    try:
        return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=_ABS_TOL)
    except OverflowError:
        if any(isinstance(x, float) and not math.isfinite(x) for x in (a, b)):
            return False  # an infinity is close only to itself, and the other side is an integer
        fa, fb = fractions.Fraction(a), fractions.Fraction(b)
        return abs(fa - fb) <= max(fractions.Fraction(_REL_TOL) * max(abs(fa), abs(fb)), fractions.Fraction(_ABS_TOL))


class _TooLong:
    """An integer literal with more digits than any accepted value's integers (and than any finite float
    has): it can equal none of them, so it is never converted (the host's int() refuses over 4,300 digits,
    and converting a megabyte of digits takes seconds). Equals nothing under either rule."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<integer too long>"


_TOO_LONG = _TooLong()
_FLOAT_DIGITS = 311  # an integer of more digits is over 1e310: no finite float is within 1e-9 of it


def _max_int_digits(values: Any) -> int:
    """The most decimal digits of any integer in ``values`` (an upper bound; iterative)."""
    most, stack = 0, [values]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, int) and not isinstance(v, bool):
            most = max(most, v.bit_length() * 30103 // 100000 + 2)
    return most


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def loads_result(data: bytes, int_digits: int = 0) -> Any:
    """JSON the solution may control, decoded for comparison: ValueError for anything the honest harness
    (``json.dumps(..., allow_nan=False)``) cannot have written (not UTF-8, NaN, Infinity, a number that
    overflows to infinity, nesting past the parser's depth); an integer of more than
    max(``int_digits``, 311) digits decodes as a value that equals nothing (see ``_TooLong``)."""
    cap = max(int_digits, _FLOAT_DIGITS)
    limit = sys.get_int_max_str_digits() or cap  # int()'s own limit on digits (0: none)

    def parse_int(text: str) -> Any:
        digits = len(text) - text.startswith("-")
        if digits > cap:
            return _TOO_LONG
        if digits <= limit:
            return int(text)
        return int(decimal.Decimal(text))  # an accepted value this long: exact, and not limited

    if re.search(b"[0-9]{%d}" % (min(cap, limit) + 1), data) is None:
        parse_int = None  # no integer this long: json's own int() (a Python call per integer is 4x slower)

    def parse_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError("a number out of float's range")
        return value

    try:
        text = data.decode("utf-8")
        return json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=_refuse_constant)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e


def _printable(text: str) -> str:
    """Text any writer can encode: a lone surrogate (a solution's ``ValueError('\\ud800')``) is escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _detail(text: str) -> str:
    return clip(_printable(text))



def classify_run(run: RunResult) -> tuple[str, dict] | None:
    """Failure kind of a run from how it ended, or None if it exited 0 within its limits."""
    info: dict[str, Any] = {"wall_s": round(run.wall_s, 3)}
    stderr = run.stderr_tail.decode("utf-8", errors="replace")
    if run.status == "sandbox_error":
        return "verifier_error", {**info, "reason": "sandbox failed to start: " + _detail(stderr)}
    if run.status in ("timeout", "output_limit"):
        return run.status, info
    sig = run.signal
    if sig == signal.SIGXCPU:
        return "timeout", {**info, "reason": "CPU time limit"}
    # Python ignores SIGXFSZ, so a file over RLIMIT_FSIZE shows up as EFBIG ("File too large"); a full
    # /tmp as ENOSPC.
    full = "[Errno 27] File too large" in stderr or "[Errno 28] No space left on device" in stderr
    if sig == signal.SIGXFSZ or (run.returncode != 0 and full):
        return "output_limit", {**info, "reason": "file size limit"}
    if run.returncode != 0:
        kind = "memory" if "MemoryError" in stderr or run.oom_killed else "runtime_error"
        return kind, {**info, "returncode": run.returncode, "stderr": _detail(stderr)}
    return None


def _marked_result(stdout: bytes, nonce: str, int_digits: int = 0) -> dict | tuple[str, dict]:
    """The harness's last line after the nonce, as a dict, or a failure verdict. In call mode the solution
    shares the harness's process and can write that line itself: whatever the line holds ends here in a
    dict or a failure, never in an exception."""
    pos = stdout.rfind(b"\n" + nonce.encode())
    if pos < 0:
        return "runtime_error", {"reason": "no result: the program exited before the harness reported"}
    line = stdout[pos + 1 + len(nonce) :].split(b"\n", 1)[0]
    try:
        result = loads_result(line, int_digits)
    except ValueError as e:
        return "runtime_error", {"reason": _detail(f"unparseable result line ({e})")}
    if not isinstance(result, dict):
        return "runtime_error", {"reason": "malformed result"}
    return result


def _harness_error(result: dict, kinds: tuple[str, ...]) -> tuple[str, dict]:
    error, message = result.get("error"), result.get("message")
    kind = error if type(error) is str and error in kinds else "runtime_error"
    return kind, {"reason": _detail(message if type(message) is str else "")}


def judge_call_result(stdout: bytes, nonce: str, accepted: tuple, grader: str = "vt") -> tuple[str, dict] | None:
    """Find the harness's marked line and compare its value to the ``accepted`` values here, on the host,
    by the record's rule (``values_equal``)."""
    result = _marked_result(stdout, nonce, _max_int_digits(accepted))
    if not isinstance(result, dict):
        return result
    if "ok" not in result:
        return _harness_error(result, ("memory", "runtime_error"))
    if not any(values_equal(expected, result["ok"], grader) for expected in accepted):
        line = stdout[stdout.rfind(b"\n" + nonce.encode()) + 1 + len(nonce) :].split(b"\n", 1)[0]
        return "wrong", {"reason": "return value differs", "got": _detail(line.decode("utf-8", errors="replace"))}
    return None


def judge_program_result(stdout: bytes, nonce: str) -> tuple[str, dict] | None:
    """A program test passed only on the test process's marked ``{"ok": true}``."""
    result = _marked_result(stdout, nonce)
    if not isinstance(result, dict):
        return result
    if result.get("ok") is True and len(result) == 1:
        return None
    kind, info = _harness_error(result, ("wrong", "memory", "runtime_error"))
    if kind == "runtime_error" and ("[Errno 27] File too large" in info["reason"] or "[Errno 28]" in info["reason"]):
        kind = "output_limit"  # as classify_run: the file-size cap or a full /tmp, seen as an OSError
    return kind, info
