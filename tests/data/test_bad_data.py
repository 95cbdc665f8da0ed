"""Bad data: every rejected record is counted per reason with its file:line; thresholds and start-up checks."""
from __future__ import annotations

import pytest
from data_helpers import chat, write_jsonl
from data_helpers import tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt import VtError
from vt.data.dataset import PipelineConfig, build_sft_dataset, skip_report
from vt.data.sources import open_source

SEQ = 128
N_GOOD = 40


def bad_file(tmp_path):
    lines = [chat(i) for i in range(N_GOOD)]
    # Bad lines at the end (lines 41..45) so a probe of the first records passes in unshuffled runs.
    lines += [
        '{"messages": [{"role": "user", "content": "unterminated',  # 41 malformed JSON
        {"prompt": "Q", "response": ""},  # 42 empty response
        {"prompt": "why " * 400, "response": "because"},  # 43 prompt longer than the packing length
        b'{"prompt": "\xff\xfe", "response": "x"}',  # 44 invalid UTF-8
        {"input_ids": [1, 2, 10**6], "loss_mask": [0, 1, 1]},  # 45 id outside the vocabulary
    ]
    return write_jsonl(tmp_path / "bad.jsonl", lines)


def test_counts_every_reason_with_file_and_line(tmp_path, tok):
    path = bad_file(tmp_path)
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=4, num_epochs=1, max_skip_rate=0.5, read_threads=2)
    it = iter(build_sft_dataset(open_source(path), tok, cfg))
    batches = list(it)
    report = skip_report(it)
    assert report.skipped == {"malformed_json": 1, "empty_response": 1, "prompt_too_long": 1, "invalid_utf8": 1,
                              "token_out_of_range": 1}
    assert report.seen == N_GOOD + 5 and report.used == N_GOOD and report.num_skipped == 5
    where = {r: ex[0].split(": ")[0] for r, ex in report.examples.items()}
    assert where == {"malformed_json": f"{path}:41", "empty_response": f"{path}:42", "prompt_too_long": f"{path}:43",
                     "invalid_utf8": f"{path}:44", "token_out_of_range": f"{path}:45"}
    assert "1000000" in report.examples["token_out_of_range"][0]
    summary = report.summary()
    assert "5 skipped" in summary and f"{path}:43" in summary
    # The good records all arrive, and every loss position is finite and in {0, 1}.
    assert sum(int(b["segment_ids"].max(axis=1).sum()) for b in batches) == N_GOOD
    # Under the drop policy the over-long record is counted as too_long instead.
    cfg_drop = PipelineConfig(seq_len=SEQ, global_batch_size=4, num_epochs=1, max_skip_rate=0.5, overlong="drop")
    it = iter(build_sft_dataset(open_source(path), tok, cfg_drop))
    list(it)
    assert skip_report(it).skipped["too_long"] == 1 and "prompt_too_long" not in skip_report(it).skipped


def test_skip_rate_threshold_raises_during_iteration(tmp_path, tok):
    path = bad_file(tmp_path)
    # 5 bad of 45 = 11% > 5%; the probe (first 10 records, unshuffled) is clean, so the run starts and
    # fails when the rate is crossed, naming the reasons and lines.
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=4, num_epochs=1, shuffle=False, max_skip_rate=0.05,
                         skip_check_min_records=10, probe_records=10, read_threads=0)
    data = build_sft_dataset(open_source(path), tok, cfg)
    with pytest.raises(VtError, match=r"skip rate .* above max_skip_rate") as e:
        list(data)
    assert f"{path}:41" in str(e.value) and "malformed_json" in str(e.value)


def test_probe_fails_at_start_up(tmp_path, tok):
    path = bad_file(tmp_path)
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=4, max_skip_rate=0.01, skip_check_min_records=10)
    with pytest.raises(VtError, match="probe of the first 45 records"):
        build_sft_dataset(open_source(path), tok, cfg)


def test_config_that_can_never_fit_fails_at_start_up(tmp_path, tok):
    long_prompts = write_jsonl(tmp_path / "long.jsonl",
                               [{"prompt": "word " * 300, "response": f"answer {i}"} for i in range(5)])
    with pytest.raises(VtError, match=r"no usable example .* seq_len=64") as e:
        build_sft_dataset(open_source(long_prompts), tok, PipelineConfig(seq_len=64, global_batch_size=2))
    assert "prompt_too_long: 5" in str(e.value) and f"{long_prompts}:1" in str(e.value)
    good = open_source(write_jsonl(tmp_path / "good.jsonl", [chat(0)]))
    with pytest.raises(VtError, match="at least 2 tokens"):
        build_sft_dataset(good, tok, PipelineConfig(seq_len=1, global_batch_size=2))
    with pytest.raises(VtError, match="overlong"):
        build_sft_dataset(good, tok, PipelineConfig(seq_len=64, global_batch_size=2, overlong="truncate_left"))
    with pytest.raises(VtError, match="has no records"):
        build_sft_dataset(good, tok, PipelineConfig(seq_len=64, global_batch_size=2), process_index=1,
                          process_count=2)
