"""stdin/stdout grading as each record's source grades it, checked against the sources' own graders.

LiveCodeBench records are graded by LiveCodeBench's rule and verl / PRIME / APPS records by verl's
prime_code checker; vt's own ``tests`` keep vt's rule (README: "Code reward"). The references are the
graders themselves (``nvidia-livecodebench``'s testing_util and ``verl``'s prime_code testing_util, run
by reference_graders.py in a child process) on generated pairs of printed and expected output: number
spellings, leading and trailing spaces, blank lines, extra or missing lines, words.
"""
from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from vt.rewards.code import CodeReward, StdioTest, code_tests, stdout_matches

pytest.importorskip("numpy")
REFERENCE = Path(__file__).with_name("reference_graders.py")

NUMBERS = ["3", "3.0", "3.00", "+3", "03", "3e0", "0.3e1", "-0", "0", "0.1", "0.10000001", "0.1000000001",
           "1e-9", "50000000000000000", "50000000000000001", "nan", "inf", "2.5", "2.50000", ".5", "1_000", "1000"]  # fmt: skip
WORDS = ["YES", "yes", "No", "a b", "x", "", "1 2", "1  2", "1\t2"]
PADS = ["", " ", "  ", "\t"]


def random_output(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 3)):
        k = rng.randint(1, 3)
        tokens = [rng.choice(NUMBERS if rng.random() < 0.75 else WORDS) for _ in range(k)]
        lines.append(rng.choice(PADS) + rng.choice([" ", "  "]).join(tokens) + rng.choice(PADS))
    return "\n".join(lines) + rng.choice(["", "\n", "\n\n", " \n"])


def perturb(text: str, rng: random.Random) -> str:
    """Another spelling of the same output, or a near miss."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    tokens = lines[i].split()
    choice = rng.random()
    if tokens and choice < 0.5:
        j = rng.randrange(len(tokens))
        tokens[j] = rng.choice(NUMBERS)
        lines[i] = rng.choice(PADS) + " ".join(tokens) + rng.choice(PADS)
    elif choice < 0.7:
        lines.insert(i, rng.choice(["", " "]))
    elif choice < 0.85:
        lines[i] = rng.choice(PADS) + lines[i].strip() + rng.choice(PADS)
    else:
        del lines[i]
    return "\n".join(lines)


def cases(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        expected = random_output(rng)
        printed = perturb(expected, rng) if rng.random() < 0.8 else random_output(rng)
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
