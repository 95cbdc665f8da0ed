"""What a code test is: the three test kinds, and a record's ``tests`` list (vt's own form) read into them.

  - stdin/stdout ``{"input": str, "output": str}`` (``StdioTest``): stdout is compared to ``output`` after
    stripping trailing whitespace on every line and trailing blank lines (grading.py, ``stdout_matches``);
  - call-based ``{"fn_name": str, "args": [...], "expected": <JSON>}`` (``CallTest``): the function may be
    top-level or a method of ``class Solution``. Its return value is JSON-serialised inside the sandbox, with a
    random per-run marker, and compared *on the host* to ``expected`` (grading.py, ``judge_call_result``): the
    expected value never enters the sandbox, so patched builtins, an always-true ``__eq__`` (not
    JSON-serialisable: rejected) or a printed "PASSED" cannot fake a pass, and a program that exits before the
    harness prints its result fails;
  - program ``{"program": str, "setup": str (optional), "entry": [str] (optional)}`` (``ProgramTest``): Python
    test code (asserts, HumanEval's ``check(candidate)``) run against the solution's top-level names; a
    builtin's name reaches the test only when it is one of the record's ``entry`` points. The solution and the
    test code run in two processes (sandbox/inside/harness.py, run_program): the tests call the solution's
    functions through stand-ins that pass plain values by copy, so exiting early, patching builtins or
    modules, an always-equal return value or a printed "PASSED" cannot make a test pass; the verdict is
    written by the test process after a per-run nonce the solution's process never sees. ``setup`` (MBPP's
    ``test_setup_code``) runs before the solution and before the tests.

A new test kind (a fourth mode): its name in ``MODES`` and a dataclass here (with ``mode``), a branch in
``parse_tests``; its request and verdict in grading.py (``run_test``); its function in the in-sandbox harness
(sandbox/inside/harness.py, ``RUN_MODE``), and in the warm server's ``TESTED_MODES`` if its test code runs in a
process of its own (sandbox/inside/pool_server.py). The two in-sandbox programs never import vt: they copy
``MODES``, and tests/rewards/test_code_programs.py checks that the copies agree.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from vt.rewards.base import RewardSpecError

# The test kinds, named as the sandbox's harness knows them (its argv mode, the warm server's request "mode").
MODES = ("stdin", "call", "program")


@dataclasses.dataclass(frozen=True)
class StdioTest:
    mode: ClassVar[str] = "stdin"
    input: str
    output: str
    # How stdout is compared with ``output``: as the record's source grades it (see ``stdout_matches``).
    grader: str = "vt"


@dataclasses.dataclass(frozen=True)
class CallTest:
    mode: ClassVar[str] = "call"
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
    mode: ClassVar[str] = "program"
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
    return sorted(unbound_names(source) - BUILTIN_NAMES)


BUILTIN_NAMES = frozenset(dir(builtins))


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



def _entry_field(value: Any, where: str) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise RewardSpecError(f"{where}: must be a Python identifier or a list of them")
    return tuple(names)


def check_python(source: str, where: str) -> None:
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
            check_python(t.get("setup", "") + "\n" + t["program"], f"{at}.program")
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


