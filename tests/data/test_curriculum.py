"""Curriculum: profiling-file parsing, the stage-2 hard subset, stratification; quality filters."""
from __future__ import annotations

import pytest
from data_helpers import write_jsonl
from data_helpers import tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt import VtError
from vt.data.curriculum import (bucket_of, load_pass_rates, select_hard_subset, stratify, token_trace_length)
from vt.data.filters import NgramDecontaminator, repetition_score
from vt.data.sources import ListSource, Malformed, SubsetSource, record_from_dict


def rec(i, prompt_id, trace_len, **extra):
    return record_from_dict({"id": f"t{i}", "prompt_id": prompt_id, "trace_length": trace_len, **extra,
                             "messages": [{"role": "user", "content": f"q {prompt_id}"},
                                          {"role": "assistant", "content": f"trace {i}"}]},
                            where=f"sft.jsonl:{i + 1}", default_id=str(i))


@pytest.fixture
def profiled(tmp_path):
    # Error rate = 1 - pass_rate over n = 8 rollouts; the threshold is >= 0.75 (at most 2 of 8 correct).
    path = write_jsonl(tmp_path / "profile.jsonl", [
        {"id": "hard", "pass_rate": 0.0, "n": 8},
        {"id": "edge", "pass_rate": 0.25, "n": 8},  # exactly 75% errors: selected
        {"id": "easy", "pass_rate": 0.375, "n": 8},  # 62.5% errors: not selected
        {"id": "few", "pass_rate": 0.0, "n": 4},  # too few rollouts to trust
    ])
    records = [rec(0, "hard", 6000), rec(1, "hard", 4999), rec(2, "edge", 5000), rec(3, "easy", 9000),
               rec(4, "few", 9000), rec(5, "unprofiled", 9000), Malformed("malformed_json", "sft.jsonl:7")]
    return path, ListSource(records)


def test_hard_subset_selection(profiled, tok):
    path, src = profiled
    rates = load_pass_rates(path)
    assert rates["edge"].error_rate == 0.75 and rates["few"].n == 4
    length = token_trace_length(tok)
    idx, report = select_hard_subset(src, rates, trace_length=length, missing="exclude")
    assert idx == [0, 2]  # multi-path traces of one prompt are judged each on its own length
    assert (report.total, report.selected, report.too_short, report.too_easy, report.too_few_rollouts,
            report.missing_pass_rate, report.malformed) == (7, 2, 1, 1, 1, 1, 1)
    assert report.missing_examples == ["unprofiled"]
    idx_inc, _ = select_hard_subset(src, rates, trace_length=length, missing="include")
    assert idx_inc == [0, 2, 5]
    with pytest.raises(VtError, match=r"sft.jsonl:6: prompt id 'unprofiled' has no pass rate"):
        select_hard_subset(src, rates, trace_length=length)  # default policy: a missing id is an error
    sub = SubsetSource(src, idx)
    assert [sub[i].id for i in range(len(sub))] == ["t0", "t2"]


def test_trace_length_falls_back_to_tokens(tok):
    r = record_from_dict({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b c"}]},
                         where="w", default_id="x")
    assert token_trace_length(tok)(r) == len(tok.encode("a b c"))


@pytest.mark.parametrize("line, message", [
    ("{bad", "not a JSON line"),
    ('{"id": "a", "pass_rate": NaN, "n": 8}', "not a JSON line: bare NaN"),  # issue 46: bare NaN is not JSON
    ('{"id": ' + "[" * 100_000 + "]" * 100_000 + "}", "not a JSON line: brackets nested too deeply"),
    ('{"id": "a", "pass_rate": 0.5}', "expected"),
    ('{"id": "a", "pass_rate": 1.5, "n": 8}', "not a number in"),
    ('{"id": "a", "pass_rate": 0.5, "n": 0}', "positive integer"),
    ('{"id": "a", "pass_rate": 0.3, "n": 8}', "not k/8"),
    ('{"id": "x", "pass_rate": 0.5, "n": 8}', "duplicate id 'x' .first at line 1"),
])
def test_profiling_file_errors_name_the_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": "x", "pass_rate": 0.5, "n": 2}, "", line])
    with pytest.raises(VtError, match=f"{path}:3: .*{message}"):
        load_pass_rates(path)
    with pytest.raises(VtError, match="not found"):
        load_pass_rates(tmp_path / "nope.jsonl")


def test_stratify_by_difficulty_and_length(tok):
    src = ListSource([rec(0, "a", 100, difficulty=0.1), rec(1, "b", 3000, difficulty=0.9), rec(2, "c", 8000,
                      pass_rate=0.5), rec(3, "d", 100), Malformed("missing_field", "x:1")])
    cells = stratify(src, difficulty_edges=[0.34, 0.67], length_edges=[1000, 5000],
                     trace_length=token_trace_length(tok))
    assert cells == {(-1, 0): [3], (0, 0): [0], (1, 2): [2], (2, 1): [1]}
    assert bucket_of(5000, [1000, 5000]) == 2 and bucket_of(999, [1000, 5000]) == 0
    with pytest.raises(VtError, match="ascending"):
        stratify(src, difficulty_edges=[0.5, 0.1], length_edges=[1], trace_length=token_trace_length(tok))


def test_filters():
    assert repetition_score("one two three four five six seven eight nine ten eleven twelve", n=3) == 0.0
    assert repetition_score("so " * 100, n=10) > 0.9
    eval_q = ("Find the sum of all integer bases $b>9$ for which $17_b$ is a divisor of $97_b.$ "
              "Let's think step by step.")
    deco = NgramDecontaminator([eval_q, "What is 2+2?"])
    leaked = "Here is a problem: find the SUM of all integer bases b > 9 for which 17_b is a divisor of 97_b!"
    assert deco.is_contaminated(leaked)
    assert not deco.is_contaminated("Find the sum of all integer bases for which a number divides another.")
    assert not deco.is_contaminated("what is 2 2 plus more")  # short eval texts under 6 words are ignored
