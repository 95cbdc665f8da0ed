"""`vt reward` end to end, as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_rubric_reward import FakeJudgeServer


def vt_reward(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vt", "reward", *args], capture_output=True, text=True, timeout=300
    )


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_math_stem_instruct_code(tmp_path):
    cases = {
        "math": [
            {"id": 1, "completion": "<think>...</think> \\boxed{70}", "ground_truth": 70},
            {"id": 2, "completion": "\\boxed{71}", "reward_model": {"ground_truth": "70"}},
            {"id": 3, "completion": "\\boxed{1} or \\boxed{2}", "ground_truth": "1"},
        ],
        "stem": [{"completion": "Answer: (B)", "ground_truth": "B"}, {"completion": "\\boxed{2.0}", "ground_truth": 3}],
        "instruct": [
            {"completion": "the weather is nice today", "constraints": [{"type": "all_lowercase"}, {"type": "title"}]},
            # IFEval's own record, as the dataset ships it (unused kwargs are null)
            {"key": 1001, "prompt": "Write a title and no commas.", "completion": "<<Joy>>\nNo commas, sorry.",
             "instruction_id_list": ["detectable_format:title", "punctuation:no_comma"],
             "kwargs": [{"num_words": None}, {"num_words": None}]},
        ],
        "code": [
            {"completion": "```python\nprint(int(input()) * 2)\n```", "tests": [{"input": "4", "output": "8"}]},
            {"completion": "```python\nwhile True: pass\n```", "tests": [{"input": "4", "output": "8"}]},
            # HumanEval's record shape: test + entry_point
            {"task_id": "X/0", "prompt": "def double(x):\n", "entry_point": "double",
             "test": "def check(candidate):\n    assert candidate(4) == 8\n",
             "completion": "```python\ndef double(x):\n    return 2 * x\n```"},
        ],
    }
    expected = {"math": [1.0, 0.0, 0.0], "stem": [1.0, 0.0], "instruct": [0.5, 0.5], "code": [1.0, 0.0, 1.0]}
    for domain, records in cases.items():
        inp, out = write_jsonl(tmp_path / f"{domain}.jsonl", records), tmp_path / f"{domain}.out.jsonl"
        timeout = ["--timeout", "3"] if domain != "instruct" else []  # instruct has no time limit to set
        proc = vt_reward("--domain", domain, "--input", str(inp), "--out", str(out), *timeout)
        assert proc.returncode == 0, proc.stderr
        scored = read_jsonl(out)
        assert [r["score"] for r in scored] == expected[domain], scored
        assert all({k: r[k] for k in rec} == rec for r, rec in zip(scored, records))  # input fields kept
        assert all("failure" in r["details"] for r in scored)
        assert f"{len(records)} records" in proc.stderr
    math_out = read_jsonl(tmp_path / "math.out.jsonl")
    assert [r["details"]["failure"] for r in math_out] == [None, "wrong", "format"]
    assert read_jsonl(tmp_path / "code.out.jsonl")[1]["details"]["failure"] == "timeout"


def test_rubric_against_local_server(tmp_path):
    server = FakeJudgeServer()
    try:
        inp = write_jsonl(tmp_path / "in.jsonl", [{"completion": "c", "prompt": "p", "rubric": "coherence"}])
        out = tmp_path / "out.jsonl"
        proc = vt_reward("--domain", "rubric", "--input", str(inp), "--out", str(out), "--judge-url", server.url,
                         "--judge-model", "j")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert read_jsonl(out)[0]["score"] == pytest.approx(7 / 9)
    finally:
        server.close()
    proc = vt_reward("--domain", "rubric", "--input", str(inp), "--out", str(out))
    assert proc.returncode == 2 and "--judge-url" in proc.stderr


def test_invalid_json_line_is_named_and_existing_output_survives(tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"completion": "\\boxed{1}", "ground_truth": 1}, "", "{not json"])
    out = tmp_path / "out.jsonl"
    out.write_text("precious earlier results\n")
    proc = vt_reward("--domain", "math", "--input", str(inp), "--out", str(out))
    assert proc.returncode == 2
    assert f"{inp}:3: invalid JSON" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert out.read_text() == "precious earlier results\n"
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


@pytest.mark.parametrize(
    "domain, record, message",
    [
        ("math", {"completion": "x"}, ":2: missing field 'ground_truth'"),
        ("math", {"ground_truth": 1}, ":2: field 'completion' missing or not a string"),
        ("code", {"completion": "x", "tests": [{"input": "1"}]}, ":2: field 'tests'[0]: stdin/stdout test without"),
        ("instruct", {"completion": "x", "constraints": [{"type": "nope"}]}, ":2: field 'constraints'[0].type"),
        ("math", [1, 2], ":2: expected a JSON object"),
    ],
)
def test_bad_records_are_named_by_line(tmp_path, domain, record, message):
    good = {"completion": "x", "ground_truth": 1, "tests": [{"input": "", "output": ""}], "constraints": [{"type": "title"}]}
    inp = write_jsonl(tmp_path / "in.jsonl", [good, record])
    proc = vt_reward("--domain", domain, "--input", str(inp), "--out", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 2 and f"{inp}{message}" in proc.stderr, proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_missing_input_file(tmp_path):
    proc = vt_reward("--domain", "math", "--input", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_a_lone_surrogate_in_a_verdict_does_not_stop_the_others(tmp_path):
    """A program's exception message with a lone surrogate (valid JSON from the sandbox, not Unicode) reaches the
    record's details; the writer replaces it (U+FFFD) and every record is written."""
    records = [
        {"task_id": "X/0", "prompt": "def f(x):\n", "entry_point": "f",
         "test": "def check(candidate):\n    assert candidate(1) == 2\n",
         "completion": "```python\ndef f(x):\n    raise ValueError('\\ud800')\n```"},
        {"completion": "```python\nprint(1)\n```", "tests": [{"input": "", "output": "1"}]},
    ]
    inp, out = write_jsonl(tmp_path / "in.jsonl", records), tmp_path / "out.jsonl"
    proc = vt_reward("--domain", "code", "--input", str(inp), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    raw = out.read_bytes().decode("utf-8")  # strict: the file is valid UTF-8
    scored = [json.loads(line) for line in raw.splitlines()]
    assert [r["score"] for r in scored] == [0.0, 1.0], scored
    assert scored[0]["details"]["failure"] == "runtime_error"
    # The message reaches the record as U+FFFD (the writer's replacement) or escaped by the verifier; the writer
    # itself is tested on every kind of record in tests/test_io.py.
    assert "\ufffd" in raw or "\\\\ud800" in raw, raw


@pytest.mark.parametrize("line, message", [
    ('{"completion": "x", "ground_truth": ' + "[" * 100_000 + "]" * 100_000 + "}", "brackets nested too deeply"),
    ('{"completion": "x", "ground_truth": NaN}', "bare NaN is not JSON"),
    ('{"completion": "x", "ground_truth": Infinity}', "bare Infinity is not JSON"),
])
def test_unreadable_lines_are_one_line_naming_file_and_line(tmp_path, line, message):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"completion": "\\boxed{1}", "ground_truth": 1}, line])
    proc = vt_reward("--domain", "math", "--input", str(inp), "--out", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{inp}:2: invalid JSON ({message}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()
