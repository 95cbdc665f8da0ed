"""Data sources: verl parquet (aime25), chat JSONL in both shapes, ArrayRecord, TFDS specs, open_source."""
from __future__ import annotations

import importlib.util

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import chat, write_jsonl
from data_helpers import aime25_path, tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt import VtError
from vt.data.sources import (ArrayRecordSource, ConcatSource, JsonlSource, Malformed, Record, open_source,
                             parse_tfds_spec, write_array_record)


def test_aime25_parquet(aime25_path, tok):
    src = open_source(aime25_path)
    assert len(src) == 30
    recs = [src[i] for i in range(30)]
    assert all(isinstance(r, Record) for r in recs)
    assert all(isinstance(r.ground_truth, int) and not isinstance(r.ground_truth, bool) for r in recs)
    assert recs[0].ground_truth == 70  # AIME 2025 I problem 1
    assert {r.domain for r in recs} == {"math"}
    assert [r.id for r in recs] == [str(i) for i in range(30)]  # extra_info.index
    for r in recs:
        assert len(r.messages) == 1 and r.messages[0]["role"] == "user"
        assert r.response is None and r.prompt == r.messages
        assert "\\boxed{}" in r.messages[0]["content"]
        assert r.metadata["extra_info"]["split"] == "test"
    text = tok.apply_chat_template(recs[0].prompt, add_generation_prompt=True)
    assert text.startswith("<|im_start|>user\nFind the sum") and text.endswith("<|im_start|>assistant\n")


def test_verl_parquet_string_ground_truth(tmp_path):
    rows = [{"data_source": "stem", "ability": "stem",
             "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Pick one."}],
             "reward_model": {"ground_truth": "(B)", "style": "rule"}, "extra_info": {"index": 7, "split": "train"}}]
    path = tmp_path / "stem.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    (rec,) = [open_source(path)[0]]
    assert rec.ground_truth == "(B)" and rec.domain == "stem" and rec.id == "7"
    assert [m["role"] for m in rec.messages] == ["system", "user"]
    assert rec.metadata["data_source"] == "stem"
    assert rec.where == f"{path}:row 0"


def test_jsonl_both_shapes_and_metadata(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        chat(0),
        "",  # blank lines are not records
        {"prompt": "Q?", "response": "A.", "domain": "chat", "difficulty": 0.3, "metadata": {"trace_length": 9}},
        {"prompt": [{"role": "user", "content": "Q2"}], "response": "A2", "pass_rate": 0.5, "prompt_id": "q2"},
    ])
    src = JsonlSource(path)
    assert len(src) == 3
    r0, r1, r2 = src[0], src[1], src[2]
    assert r0.id == "r0" and r0.response.endswith("\\boxed{0}.")
    assert r1.messages == ({"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."})
    assert r1.domain == "chat" and r1.metadata == {"difficulty": 0.3, "trace_length": 9}
    assert r1.id == "d:3" and r1.where == f"{path}:3"  # 1-based line numbers, blank line counted
    assert r2.prompt_id == "q2" and r2.metadata["pass_rate"] == 0.5


def test_jsonl_malformed_items_carry_reason_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        "{not json",
        b'{"prompt": "caf\xe9", "response": "x"}',  # latin-1 byte: invalid UTF-8
        {"prompt": "Q", "response": "   "},
        {"text": "no known field"},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"input_ids": [1, 2, 3]},
        [1, 2],
        '{"prompt": "Q", "response": "A", "ground_truth": NaN}',  # issue 46: Python's json reads bare NaN
        '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}",  # was a RecursionError out of the reader
    ])
    src = JsonlSource(path)
    got = [(src[i].reason, src[i].where) for i in range(len(src))]
    assert all(isinstance(src[i], Malformed) for i in range(len(src)))
    assert got == [("malformed_json", f"{path}:1"), ("invalid_utf8", f"{path}:2"), ("empty_response", f"{path}:3"),
                   ("missing_field", f"{path}:4"), ("bad_message", f"{path}:5"), ("missing_field", f"{path}:6"),
                   ("malformed_json", f"{path}:7"), ("malformed_json", f"{path}:8"), ("malformed_json", f"{path}:9")]
    assert "bare NaN" in src[7].detail and "nested too deeply" in src[8].detail


def test_array_record_round_trip(tmp_path):
    p1, p2 = tmp_path / "a.array_record", tmp_path / "b.array_record"
    write_array_record(p1, [chat(0), chat(1)])
    write_array_record(p2, [chat(2), b"\xff\xfe"])
    src = ArrayRecordSource([p1, p2])
    assert len(src) == 4
    assert [src[i].id for i in range(3)] == ["r0", "r1", "r2"]
    assert src[3].reason == "invalid_utf8" and src[3].where == f"{p2}:record 1"
    assert len(open_source(f"arrayrecord:{tmp_path}/*.array_record")) == 4
    assert len(open_source(str(p1))) == 2


def test_open_source_specs(tmp_path, aime25_path):
    j = write_jsonl(tmp_path / "x.jsonl", [chat(0), chat(1)])
    mix = open_source([str(j), str(aime25_path)])
    assert isinstance(mix, ConcatSource) and len(mix) == 32
    assert mix[1].id == "r1" and mix[2].domain == "math"
    assert len(open_source(f"{j},{aime25_path}")) == 32
    assert len(open_source(str(tmp_path / "*.jsonl"))) == 2
    with pytest.raises(VtError, match="no such file"):
        open_source(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(VtError, match="unknown data format"):
        open_source(tmp_path / "x.csv")
    with pytest.raises(VtError, match="no files match"):
        open_source(str(tmp_path / "*.parquet"))


def test_tfds_spec():
    assert parse_tfds_spec("tfds:gsm8k/main:train") == ("gsm8k/main", "train", None)
    assert parse_tfds_spec("tfds:mbpp:test@/data/tfds") == ("mbpp", "test", "/data/tfds")
    assert parse_tfds_spec("tfds:squad") == ("squad", "train", None)
    if importlib.util.find_spec("tensorflow_datasets") is None:
        with pytest.raises(VtError, match="tensorflow-datasets"):
            open_source("tfds:gsm8k/main:train")
    else:  # installed but nothing prepared locally: a clear error, never a download
        with pytest.raises(VtError, match="tfds build"):
            open_source("tfds:vt_no_such_dataset:train")
