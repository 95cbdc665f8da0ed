"""Code reward: the last fenced code block, run against unit tests in the sandbox; all tests must pass.

Tests (LiveCodeBench style), per record under ``tests``:
  - stdin/stdout: ``{"input": str, "output": str}``; stdout is compared to ``output`` after stripping
    trailing whitespace on every line and trailing blank lines;
  - call-based: ``{"fn_name": str, "args": [...], "expected": <JSON>}``; the function may be top-level or
    a method of ``class Solution``. Its return value is JSON-serialised inside the sandbox, with a random
    per-run marker, and compared *here* to ``expected``: the expected value never enters the sandbox, so
    patched builtins, an always-true ``__eq__`` (not JSON-serialisable: rejected) or a printed "PASSED"
    cannot fake a pass, and a program that exits before the harness prints its result fails. Compared as
    the record's source compares (``values_equal``): integers exactly; floats within 1e-9 relative for
    vt's own records, exactly (Python's ``==``) for LiveCodeBench's and verl/APPS's. The solution can
    write the marked line itself (it shares the harness's process): whatever the line holds is read
    strictly (``loads_result``) and ends in a verdict, never in an exception;
  - program: ``{"program": str, "setup": str (optional), "entry": [str] (optional)}``: Python test code
    (asserts, HumanEval's ``check(candidate)``) run against the solution's top-level names; a builtin's
    name reaches the test only when it is one of the record's ``entry`` points (HumanEval's
    ``entry_point``; MBPP's functions, see ``mbpp_entry``). The solution and the test code run
    in two processes (_harness.py, run_program): the tests call the solution's functions through
    stand-ins that pass plain values by copy, so exiting early, patching builtins or modules, an
    always-equal return value or a printed "PASSED" cannot make a test pass; the verdict is written by
    the test process after a per-run nonce the solution's process never sees. ``setup`` (MBPP's
    ``test_setup_code``) runs before the solution and before the tests.

Record shapes read as they come (all become the ``tests`` list above, vt's one internal form; see
``code_tests``): vt's own ``tests``; HumanEval's ``test`` + ``entry_point``; MBPP's ``test_list`` (+
``test_setup_code``); LiveCodeBench's ``public_test_cases`` / ``private_test_cases`` (+ ``metadata``'s
``func_name``); and verl / PRIME / APPS code data, whose ``reward_model.ground_truth`` (or
``ground_truth``) holds ``{"inputs": [...], "outputs": [...], "fn_name"?: str}`` as JSON.

A sample's tests run one after another in one warm sandbox of the pool (pool.py), each test in its own
forked child with the per-test limits; tests stop at the first failure and when the per-problem time
budget is spent. ``pool=False`` (and unsandboxed mode) runs each test in a cold sandbox of its own
(sandbox.py), as before the pool: same verdicts, slower. Failure kinds: wrong, timeout, runtime_error,
output_limit, memory, format (no Python code block); a sandbox that could not start is a verifier error,
and nothing a solution prints, returns or raises is (tests/rewards/test_code_verdicts.py).
"""
from __future__ import annotations

import ast
import base64
import builtins
import dataclasses
import decimal
import fractions
import functools
import io
import json
import math
import pickle
import queue
import re
import secrets
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vt.rewards.base import (
    RewardFunction,
    RewardResult,
    RewardSpecError,
    answer_region,
    clip,
    failed,
    field,
    map_bounded,
    passed,
    verifier_error,
)
from vt.rewards.sandbox.cold import Limits, RunResult, Sandbox, force_rmtree, prepare_code_dir
from vt.rewards.sandbox.warm import SandboxPool

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


def last_code_block(text: str) -> tuple[str, str] | None:
    """(language tag, code) of the last complete fenced block, or None."""
    last = None
    for m in _FENCE_RE.finditer(text):
        last = m
    if last is None:
        return None
    return last.group(1).lower(), last.group(2)


@dataclasses.dataclass(frozen=True)
class StdioTest:
    input: str
    output: str
    # How stdout is compared with ``output``: as the record's source grades it (see ``stdout_matches``).
    grader: str = "vt"


@dataclasses.dataclass(frozen=True)
class CallTest:
    fn_name: str
    args: list
    expected: Any
    # Other accepted return values: APPS/PRIME data often wraps a call's expected value in a list, and
    # their checker accepts either the list or its single element. (verl's checker also accepts the first
    # element of a longer list, 3 for [3, 7]; vt does not.)
    alternatives: tuple = ()
    # How the returned value is compared with ``expected``: as the record's source compares it (see
    # ``values_equal``).
    grader: str = "vt"


@dataclasses.dataclass(frozen=True)
class ProgramTest:
    test: str  # Python test code; raises (AssertionError or any other exception) when the solution fails
    setup: str = ""  # run before the solution and before the tests (MBPP's test_setup_code)
    # The record's own entry points (HumanEval's entry_point, MBPP's functions): exposed to the test even
    # where the name is a builtin's (MBPP 126's ``def sum(a, b)``); any other builtin name the solution
    # defines stays hidden from the test (see ``free_names``).
    entry: tuple[str, ...] = ()

    @property
    def exposed(self) -> list[str]:
        """The solution's names the test program may see: see ``free_names``."""
        return free_names(self.setup + "\n" + self.test)


# Nodes whose ``name`` (when set) binds it: definitions, ``except E as name``, match captures.
_BINDS_ITS_NAME = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler, ast.MatchAs, ast.MatchStar)


def free_names(source: str) -> list[str]:
    """Names the test code reads but never binds, minus Python's builtins: the entry point, MBPP's
    functions, a helper the test calls (HumanEval/32's ``poly``), a module the solution imported.

    Only these of the solution's top-level names reach the test program. A name the test binds anywhere
    (assigned, defined, imported, a parameter) stays the test's own, and a builtin is never taken from the
    solution (unless it is one of the record's ``entry`` points): a wrong solution that also defines
    ``abs`` or ``set`` to return 0 would otherwise pass ``assert abs(candidate(x) - y) < 1e-6``.
    Conservative: a name bound in one scope and read in another counts as bound.
    """
    return sorted(unbound_names(source) - _BUILTIN_NAMES)


_BUILTIN_NAMES = frozenset(dir(builtins))


@functools.lru_cache(maxsize=4096)
def unbound_names(source: str) -> frozenset[str]:
    """Names the code reads but never binds, builtins included (see ``free_names``)."""
    loaded, bound = set(), set()
    # ast.walk's generators cost as much as the parse on HumanEval's tests; this walks the same nodes.
    stack = [ast.parse(source)]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is ast.Name:
            (loaded if type(node.ctx) is ast.Load else bound).add(node.id)
        elif kind in _BINDS_ITS_NAME:
            if node.name:
                bound.add(node.name)
        elif kind is ast.arg:
            bound.add(node.arg)
        elif kind is ast.alias:
            bound.add(node.asname or node.name.split(".")[0])
        elif kind is ast.Global or kind is ast.Nonlocal:
            bound.update(node.names)
        elif kind is ast.MatchMapping and node.rest:
            bound.add(node.rest)
        for field in node._fields:
            child = getattr(node, field, None)
            if type(child) is list:
                stack += [c for c in child if isinstance(c, ast.AST)]
            elif isinstance(child, ast.AST):
                stack.append(child)
    return frozenset(loaded - bound)


def mbpp_entry(code: Any, asserts: str, setup: str = "") -> tuple[str, ...]:
    """MBPP's entry points: the top-level functions of the record's reference ``code`` that its tests read;
    without a (parseable) ``code``, the function each assert calls at its top (``assert NAME(...) == ...``,
    ``assert NAME(...)``, ``assert not NAME(...)``). A builtin called at the top is an entry point only
    when the assert calls no other function the test does not define: in ``assert set(f(a)) == set(b)``
    the task's function is ``f``, and a solution's own ``set`` must stay hidden from the test."""
    reads = unbound_names(setup + "\n" + asserts)
    if isinstance(code, str):
        try:
            tree = ast.parse(code)
        except SyntaxError:
            tree = None
        if tree is not None:
            defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            return tuple(sorted(defined & reads))
    entry = set()
    for node in ast.parse(asserts).body:
        if not isinstance(node, ast.Assert):
            continue
        top = node.test
        if isinstance(top, ast.Compare):
            top = top.left
        elif isinstance(top, ast.UnaryOp) and isinstance(top.op, ast.Not):
            top = top.operand
        if not (isinstance(top, ast.Call) and isinstance(top.func, ast.Name) and top.func.id in reads):
            continue
        name = top.func.id
        if name in _BUILTIN_NAMES:
            called = {c.func.id for c in ast.walk(node.test) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            if called & reads - _BUILTIN_NAMES:
                continue  # a builtin around the task's own function: set(f(a)), round(f(x), 2)
        entry.add(name)
    return tuple(sorted(entry))


def _entry_field(value: Any, where: str) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise RewardSpecError(f"{where}: must be a Python identifier or a list of them")
    return tuple(names)


def _check_python(source: str, where: str) -> None:
    problem = _syntax_error(source)
    if problem is not None:
        raise RewardSpecError(f"{where}: not valid Python ({problem})")


@functools.lru_cache(maxsize=4096)
def _syntax_error(source: str) -> str | None:
    """Cached: a record's test code is parsed once, not once per sample of it (an RL group repeats it)."""
    try:
        ast.parse(source)
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    return None


CodeTest = StdioTest | CallTest | ProgramTest


def parse_tests(tests: Any, index: int) -> list[CodeTest]:
    """Validate a record's ``tests``; a case without an expected output is a dataset error."""
    where = f"record {index}: field 'tests'"
    if isinstance(tests, str):  # datasets often store the list as a JSON string
        try:
            tests = json.loads(tests)
        except (ValueError, RecursionError) as e:  # not JSON, an integer past int()'s limit, too deep
            raise RewardSpecError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(tests, list) or not tests:
        raise RewardSpecError(f"{where}: must be a non-empty list of test cases")
    out: list[CodeTest] = []
    for j, t in enumerate(tests):
        at = f"{where}[{j}]"
        if not isinstance(t, Mapping):
            raise RewardSpecError(f"{at}: must be an object")
        if "program" in t:
            if not isinstance(t["program"], str) or not t["program"].strip():
                raise RewardSpecError(f"{at}.program: must be a non-empty string of Python test code")
            if not isinstance(t.get("setup", ""), str):
                raise RewardSpecError(f"{at}.setup: must be a string")
            _check_python(t.get("setup", "") + "\n" + t["program"], f"{at}.program")
            entry = _entry_field(t.get("entry", []), f"{at}.entry")
            out.append(ProgramTest(t["program"], t.get("setup", ""), entry))
        elif "fn_name" in t:
            if not isinstance(t["fn_name"], str) or not t["fn_name"].isidentifier():
                raise RewardSpecError(f"{at}.fn_name: must be a Python identifier")
            if not isinstance(t.get("args"), list):
                raise RewardSpecError(f"{at}.args: must be a list")
            if "expected" not in t:
                raise RewardSpecError(f"{at}: call-based test without 'expected'")
            out.append(CallTest(t["fn_name"], t["args"], t["expected"]))
        else:
            if not isinstance(t.get("input"), str):
                raise RewardSpecError(f"{at}.input: must be a string")
            if not isinstance(t.get("output"), str):
                raise RewardSpecError(f"{at}: stdin/stdout test without a string 'output'")
            out.append(StdioTest(t["input"], t["output"]))
    return out


# ---- record shapes -> the one internal form (a list of tests) ------------------------------------


def code_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    """A record's tests, whatever shape it comes in (see the module docstring); RewardSpecError if none."""
    if not isinstance(record, Mapping):
        raise RewardSpecError(f"record {index}: expected an object, got {type(record).__name__}")
    if "tests" in record:
        return parse_tests(record["tests"], index)
    if "test" in record and "entry_point" in record:  # HumanEval
        test, entry = record["test"], record["entry_point"]
        if not isinstance(test, str) or not test.strip():
            raise RewardSpecError(f"record {index}: field 'test': must be a non-empty string of Python test code")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise RewardSpecError(f"record {index}: field 'entry_point': must be a Python identifier")
        _check_python(test, f"record {index}: field 'test'")
        return [ProgramTest(f"{test}\n\ncheck({entry})\n", prompt_context(record.get("prompt"), entry), (entry,))]
    if "test_list" in record:  # MBPP
        asserts, setup = record["test_list"], record.get("test_setup_code") or ""
        if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
            raise RewardSpecError(f"record {index}: field 'test_list': must be a non-empty list of strings")
        if not isinstance(setup, str):
            raise RewardSpecError(f"record {index}: field 'test_setup_code': must be a string")
        _check_python(setup, f"record {index}: field 'test_setup_code'")
        _check_python("\n".join(asserts), f"record {index}: field 'test_list'")
        test = "\n".join(asserts) + "\n"
        return [ProgramTest(test, setup, mbpp_entry(record.get("code"), test, setup))]
    if "public_test_cases" in record or "private_test_cases" in record:  # LiveCodeBench
        return livecodebench_tests(record, index)
    try:
        truth = field(record, "ground_truth", index)
    except RewardSpecError:
        raise RewardSpecError(
            f"record {index}: no tests: expected 'tests', HumanEval's 'test' + 'entry_point', MBPP's "
            "'test_list', LiveCodeBench's 'public_test_cases', or verl's 'reward_model.ground_truth'"
        ) from None
    return ground_truth_tests(truth, index)


def prompt_context(prompt: Any, entry_point: str) -> str:
    """HumanEval's prompt without the entry point's definition: the imports and helpers it gives (``poly``
    in HumanEval/32, ``encode_cyclic`` in /38), run as the test's setup so that the test calls the prompt's
    own helper, never one the solution redefined. "" when the prompt is not Python (e.g. a chat wrapper):
    the test then reads the helper from the solution, as the official harness does."""
    return _prompt_context(prompt, entry_point) if isinstance(prompt, str) else ""


@functools.lru_cache(maxsize=4096)
def _prompt_context(prompt: str, entry_point: str) -> str:
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    lines = prompt.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(lines[: first - 1] + lines[node.end_lineno :])
    return prompt


def _json_field(value: Any, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as e:  # not JSON, an integer past int()'s limit, too deep
            raise RewardSpecError(f"{where}: not valid JSON ({e})") from e
    return value


def ground_truth_tests(truth: Any, index: int) -> list[CodeTest]:
    """verl / PRIME / APPS code data: ``{"inputs", "outputs", "fn_name"?}`` (usually a JSON string)."""
    where = f"record {index}: field 'ground_truth'"
    truth = _json_field(truth, where)
    if isinstance(truth, list):  # a list of test cases: vt's, or LiveCodeBench-style with testtype
        if truth and all(isinstance(t, Mapping) and "testtype" in t for t in truth):
            return _lcb_cases(truth, None, where)
        return parse_tests(truth, index)
    if not isinstance(truth, Mapping) or "inputs" not in truth or "outputs" not in truth:
        raise RewardSpecError(f"{where}: expected JSON with 'inputs' and 'outputs' (and optional 'fn_name')")
    inputs, outputs, fn_name = truth["inputs"], truth["outputs"], truth.get("fn_name")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs or len(inputs) != len(outputs):
        raise RewardSpecError(f"{where}: 'inputs' and 'outputs' must be non-empty lists of the same length")
    tests: list[CodeTest] = []
    for j, (inp, out) in enumerate(zip(inputs, outputs)):
        at = f"{where}: case {j}"
        if fn_name:
            if not isinstance(fn_name, str) or not fn_name.isidentifier():
                raise RewardSpecError(f"{where}.fn_name: must be a Python identifier")
            args = inp if isinstance(inp, list) else [inp]
            also = (out[0],) if isinstance(out, list) and len(out) == 1 else ()
            tests.append(CallTest(fn_name, args, out, also, grader="prime"))
        else:
            inp, out = _lines(inp, f"{at} input"), _lines(out, f"{at} output")
            tests.append(StdioTest(inp, out, grader="prime"))
    return tests


def _lines(value: Any, where: str) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # APPS sometimes stores stdin/stdout as a list of lines
    if not isinstance(value, str):
        raise RewardSpecError(f"{where}: must be a string")
    return value


def livecodebench_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    """LiveCodeBench: public + private test cases (JSON; private ones may be zlib+pickle+base64)."""
    meta = _json_field(record.get("metadata") or {}, f"record {index}: field 'metadata'")
    fn_name = (meta.get("func_name") if isinstance(meta, Mapping) else None) or record.get("func_name")
    cases: list = []
    for name in ("public_test_cases", "private_test_cases"):
        value = record.get(name)
        if value in (None, "", []):
            continue
        where = f"record {index}: field '{name}'"
        if isinstance(value, str) and not value.lstrip().startswith("["):
            value = _decompress_lcb(value, where)
        value = _json_field(value, where)
        if not isinstance(value, list):
            raise RewardSpecError(f"{where}: must be a list of test cases")
        cases += value
    if not cases:
        raise RewardSpecError(f"record {index}: LiveCodeBench record without test cases")
    return _lcb_cases(cases, fn_name, f"record {index}: LiveCodeBench tests")


def _lcb_cases(cases: list, fn_name: str | None, where: str) -> list[CodeTest]:
    tests: list[CodeTest] = []
    for j, c in enumerate(cases):
        at = f"{where}[{j}]"
        if not isinstance(c, Mapping) or not isinstance(c.get("input"), str) or not isinstance(c.get("output"), str):
            raise RewardSpecError(f"{at}: needs string 'input' and 'output'")
        if c.get("testtype") == "functional":
            name = fn_name or c.get("fn_name")
            if not isinstance(name, str) or not name.isidentifier():
                raise RewardSpecError(f"{at}: functional test without a function name (metadata.func_name)")
            try:  # one JSON value per line: the call's arguments
                args = [json.loads(line) for line in c["input"].split("\n") if line.strip()]
                expected = json.loads(c["output"])
            except (ValueError, RecursionError) as e:  # not JSON, an integer past int()'s limit, too deep
                raise RewardSpecError(f"{at}: functional input/output is not JSON ({e})") from e
            tests.append(CallTest(name, args, expected, grader="livecodebench"))
        else:
            tests.append(StdioTest(c["input"], c["output"], grader="livecodebench"))
    return tests


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # plain data only: a pickle naming any callable is refused
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _decompress_lcb(value: str, where: str) -> Any:
    """LiveCodeBench's private tests: base64(zlib(pickle(json string))). Unpickled without globals."""
    try:
        data = zlib.decompress(base64.b64decode(value), bufsize=1 << 20)
        return _NoGlobals(io.BytesIO(data)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as e:
        raise RewardSpecError(f"{where}: neither JSON nor LiveCodeBench's compressed form ({e})") from e


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


@dataclasses.dataclass(frozen=True)
class CodeConfig:
    workers: int = 2  # problems graded concurrently (each runs its tests one after another)
    test_time_limit_s: float = 6.0  # wall clock per test run, interpreter start-up included
    problem_time_limit_s: float = 60.0  # budget for all of a problem's tests
    memory_bytes: int = 2 << 30
    output_bytes: int = 16 << 20
    file_bytes: int = 64 << 20
    tmp_bytes: int = 64 << 20
    nproc: int = 64
    python: str | None = None  # interpreter inside the sandbox; default: the system python3
    allow_unsandboxed: bool = False  # run WITHOUT isolation when bwrap is unavailable (warns loudly)
    pool: bool = True  # warm sandboxes (pool.py); False: a cold sandbox per test run (for comparison)

    def limits(self, wall_s: float) -> Limits:
        return Limits(
            wall_s, self.memory_bytes, self.output_bytes, self.file_bytes, self.nproc, tmp_bytes=self.tmp_bytes
        )


class CodeReward(RewardFunction):
    """1 if the completion's last Python code block passes every test in the sandbox, else 0."""

    domain = "code"
    streams = True  # score_batch maps score_one over the items

    @property
    def workers(self) -> int:
        return self.config.workers

    def __init__(self, config: CodeConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or CodeConfig(), **overrides)
        c = self.config
        self.sandbox = Sandbox(c.python, c.allow_unsandboxed, slots=c.workers)
        uids = self.sandbox.uids or [None] * c.workers
        # Unsandboxed runs keep the cold path: the pool's guarantees rest on the sandbox's namespaces.
        self.pool = SandboxPool(self.sandbox, uids) if c.pool and self.sandbox.isolated else None
        self._slots = _Slots(uids)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    @property
    def sandbox_uids(self) -> list[int]:
        """The uids untrusted programs run under (empty when the host is not root)."""
        return list(self.sandbox.uids)

    def reference(self, record: Mapping[str, Any], index: int) -> list[CodeTest]:
        return code_tests(record, index)

    def score_batch(self, references: list, completions: list[str]) -> list[RewardResult]:
        return map_bounded(lambda tc: self.score_one(*tc), list(zip(references, completions)), self.config.workers)

    def score_one(self, tests: list[CodeTest], completion: str) -> RewardResult:
        block = last_code_block(answer_region(completion))
        if block is None:
            return failed("format", reason="no fenced code block")
        lang, source = block
        if lang not in PYTHON_TAGS:
            return failed("format", reason=f"code block language {lang!r} is not Python")
        if self.pool is not None:
            with self.pool.worker(source) as worker:
                return self._run_tests(worker.run, tests)
        uid = self._slots.acquire()
        root = Path(tempfile.mkdtemp(prefix="vt-code-"))
        try:
            code_dir = prepare_code_dir(root, source)
            return self._run_tests(lambda mode, stdin, limits: self.sandbox.run(code_dir, mode, stdin, limits, uid), tests)
        finally:
            force_rmtree(root)
            self._slots.release(uid)

    def _run_tests(self, execute, tests: list) -> RewardResult:
        """``execute(mode, stdin, limits) -> RunResult``: one sandboxed run of the sample's solution."""
        c = self.config
        budget_end = time.monotonic() + c.problem_time_limit_s
        for j, test in enumerate(tests):
            left = budget_end - time.monotonic()
            if left <= 0:
                return failed("timeout", reason="problem time limit", tests_passed=j, tests_total=len(tests))
            wall = min(c.test_time_limit_s, left)
            verdict = self._run_one(execute, test, c.limits(wall))
            if verdict is not None:
                kind, info = verdict
                details = {"tests_passed": j, "tests_total": len(tests), "failed_test": j, **info}
                if kind == "verifier_error":
                    reason = details.pop("reason", "sandbox error")
                    return verifier_error(reason, **details)
                return failed(kind, **details)
        return passed(tests_passed=len(tests), tests_total=len(tests))

    def _run_one(self, execute, test, limits: Limits) -> tuple[str, dict] | None:
        """None if the test passed, else (failure kind, details)."""
        if isinstance(test, StdioTest):
            run = execute("stdin", test.input.encode(), limits)
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
            run = execute("program", request.encode(), limits)
            return classify_run(run) or judge_program_result(run.stdout, nonce)
        request = json.dumps({"nonce": nonce, "fn_name": test.fn_name, "args": test.args})
        run = execute("call", request.encode(), limits)
        bad = classify_run(run)
        if bad is not None:
            return bad
        return judge_call_result(run.stdout, nonce, (test.expected, *test.alternatives), test.grader)



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


class _Slots:
    """Concurrency slots, each with its own sandbox uid (processes of two runs never share a uid)."""

    def __init__(self, uids: list):
        self._q: queue.Queue = queue.Queue()
        for u in uids:
            self._q.put(u)

    def acquire(self):
        return self._q.get()

    def release(self, uid) -> None:
        self._q.put(uid)
