"""Record formats: each dataset shape a code record comes in, read into the one internal form (a list of tests,
tests.py). Picked by the record's keys, in ``FORMATS``' order (the first whose ``picks`` holds):

  tests          vt's own ``tests`` list (tests.py, ``parse_tests``)
  humaneval      HumanEval's ``test`` + ``entry_point`` (the prompt's helpers run as the test's setup)
  mbpp           MBPP's ``test_list`` (+ ``test_setup_code``; entry points from its reference ``code``)
  livecodebench  LiveCodeBench's ``public_test_cases`` / ``private_test_cases`` (+ ``metadata``'s ``func_name``)
  verl           verl / PRIME / APPS code data: ``reward_model.ground_truth`` (or ``ground_truth``) holding
                 ``{"inputs": [...], "outputs": [...], "fn_name"?: str}`` as JSON

A new format is one function here, decorated ``@record_format(name, picks)``; a test's ``grader`` names the
source whose rules grade it (grading.py).
"""
from __future__ import annotations

import ast
import base64
import functools
import io
import json
import pickle
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from vt.rewards.base import RewardSpecError, field
from vt.rewards.code.tests import BUILTIN_NAMES, CallTest, CodeTest, ProgramTest, StdioTest, check_python, \
    parse_tests, unbound_names

Adapter = Callable[[Mapping[str, Any], int], list[CodeTest]]
# name -> (whether a record is of this format, its adapter): tried in order, the first that picks a record reads it.
FORMATS: dict[str, tuple[Callable[[Mapping[str, Any]], bool], Adapter]] = {}


def record_format(name: str, picks: Callable[[Mapping[str, Any]], bool]) -> Callable[[Adapter], Adapter]:
    def register(adapter: Adapter) -> Adapter:
        FORMATS[name] = (picks, adapter)
        return adapter

    return register


def code_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    """A record's tests, whatever format it comes in (see the module docstring); RewardSpecError if none."""
    if not isinstance(record, Mapping):
        raise RewardSpecError(f"record {index}: expected an object, got {type(record).__name__}")
    for picks, adapter in FORMATS.values():
        if picks(record):
            return adapter(record, index)
    raise RewardSpecError(
        f"record {index}: no tests: expected 'tests', HumanEval's 'test' + 'entry_point', MBPP's "
        "'test_list', LiveCodeBench's 'public_test_cases', or verl's 'reward_model.ground_truth'")


@record_format("tests", lambda r: "tests" in r)
def vt_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    return parse_tests(record["tests"], index)


@record_format("humaneval", lambda r: "test" in r and "entry_point" in r)
def humaneval_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    test, entry = record["test"], record["entry_point"]
    if not isinstance(test, str) or not test.strip():
        raise RewardSpecError(f"record {index}: field 'test': must be a non-empty string of Python test code")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise RewardSpecError(f"record {index}: field 'entry_point': must be a Python identifier")
    check_python(test, f"record {index}: field 'test'")
    return [ProgramTest(f"{test}\n\ncheck({entry})\n", prompt_context(record.get("prompt"), entry), (entry,))]


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


@record_format("mbpp", lambda r: "test_list" in r)
def mbpp_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    asserts, setup = record["test_list"], record.get("test_setup_code") or ""
    if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
        raise RewardSpecError(f"record {index}: field 'test_list': must be a non-empty list of strings")
    if not isinstance(setup, str):
        raise RewardSpecError(f"record {index}: field 'test_setup_code': must be a string")
    check_python(setup, f"record {index}: field 'test_setup_code'")
    check_python("\n".join(asserts), f"record {index}: field 'test_list'")
    test = "\n".join(asserts) + "\n"
    return [ProgramTest(test, setup, mbpp_entry(record.get("code"), test, setup))]


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
        if name in BUILTIN_NAMES:
            called = {c.func.id for c in ast.walk(node.test) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            if called & reads - BUILTIN_NAMES:
                continue  # a builtin around the task's own function: set(f(a)), round(f(x), 2)
        entry.add(name)
    return tuple(sorted(entry))



@record_format("livecodebench", lambda r: "public_test_cases" in r or "private_test_cases" in r)
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


def _has_ground_truth(record: Mapping[str, Any]) -> bool:
    return "ground_truth" in record or isinstance(record.get("reward_model"), Mapping) and \
        "ground_truth" in record["reward_model"]


@record_format("verl", _has_ground_truth)
def verl_tests(record: Mapping[str, Any], index: int) -> list[CodeTest]:
    return ground_truth_tests(field(record, "ground_truth", index), index)


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


def _json_field(value: Any, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as e:  # not JSON, an integer past int()'s limit, too deep
            raise RewardSpecError(f"{where}: not valid JSON ({e})") from e
    return value
