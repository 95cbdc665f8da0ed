"""The SFT data path on Qwen2.5's real vocabulary: assistant-only masks (<think> text, multi-turn), packing,
curriculum lengths and streaming decode, each checked against transformers' tokenizer from the same directory."""
from __future__ import annotations

import json
import unicodedata

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen_helpers import (PIECES, hf_chat, hf_encode, hf_qwen, qwen_dir, qwen_tok,  # noqa: F401 (fixtures)
                          random_conversations, random_strings)

from vt.data import chat
from vt.data.chat import chat_token_mask
from vt.data.curriculum import PassRate, select_hard_subset, token_trace_length
from vt.data.packing import documents_in_row
from vt.data.dataset import PipelineConfig, build_sft_dataset, skip_report
from vt.data.sources import open_source

IM_END = "<|im_end|>"

THINK_CHATS = [
    [{"role": "user", "content": "Find the sum of all integer bases $b>9$ for which $17_b$ divides $97_b$."},
     {"role": "assistant", "content": "<think>\n17_b = b + 7 and 97_b = 9b + 7, so b + 7 | 56: b = 21 or 49.\n"
                                      "</think>\n\nThe sum is $\\boxed{70}$."}],
    [{"role": "system", "content": "你是一个数学助手。"},
     {"role": "user", "content": "计算 12×13。"},
     {"role": "assistant", "content": "<think>\n12×13 = 156 🙂\n</think>\n答案是 156。"},
     {"role": "user", "content": "再乘以 2？"},
     {"role": "assistant", "content": "<think>\n156×2=312\n</think>\n312"},
     {"role": "user", "content": "Write it in Python."},
     {"role": "assistant", "content": "```python\ndef f():\n    return 12 * 13 * 2  # 312\n```"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "a"},
     {"role": "user", "content": "a"}, {"role": "assistant", "content": "👨‍👩‍👧‍👦龘"}],
]


def reference_mask(ref, msgs) -> tuple[list[int], np.ndarray]:
    """The assistant-only mask from transformers alone: its rendering, its offsets, and each assistant content
    located by rendering the conversation up to that turn with the generation prompt."""
    text = hf_chat(ref, msgs)
    enc = ref(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = np.array([o[0] for o in enc["offset_mapping"]])
    mask = np.zeros(len(starts), np.int8)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            s = len(hf_chat(ref, msgs[:i], add_generation_prompt=True))
            mask[(starts >= s) & (starts < s + len(m["content"]) + len(IM_END))] = 1
    return list(enc["input_ids"]), mask


def trainable(convs):
    """Conversations a source accepts as training records: ending on a non-blank assistant turn."""
    return [c for c in convs if c[-1]["role"] == "assistant"
            and all(m["content"].strip() for m in c if m["role"] == "assistant")]


def assistant_text(msgs) -> str:
    return "".join(m["content"] + IM_END for m in msgs if m["role"] == "assistant")


def test_masks_match_transformers_and_cover_exactly_the_assistant_turns(qwen_tok, hf_qwen):
    convs = THINK_CHATS + [c for c in random_conversations(300, seed=3) if c[-1]["role"] == "assistant"]
    for msgs in convs:
        ids, mask = chat_token_mask(qwen_tok, msgs)
        ref_ids, ref_mask = reference_mask(hf_qwen, msgs)
        assert ids == ref_ids and mask.tolist() == ref_mask.tolist()
        if all(not m["content"][:1].isspace() for m in msgs if m["role"] == "assistant"):
            # The trained tokens are exactly each assistant turn's content and its <|im_end|>: no header, no
            # user text, no "\n" after <|im_end|>, and <think> ... </think> included.
            assert hf_qwen.decode(np.asarray(ids)[mask == 1]) == unicodedata.normalize("NFC", assistant_text(msgs))


def test_think_is_text_and_multi_turn_masks(qwen_tok):
    msgs = THINK_CHATS[1]
    ids, mask = chat_token_mask(qwen_tok, msgs)
    trained = qwen_tok.decode(np.asarray(ids)[mask == 1])
    assert trained == assistant_text(msgs) and trained.count("<think>") == 2
    assert int((np.asarray(ids)[mask == 1] == 151645).sum()) == 3  # each turn's <|im_end|> teaches stopping
    assert "<think>" not in qwen_tok.decode(np.asarray(ids)[mask == 0])


def _write_chats(path, convs):
    with open(path, "w", encoding="utf-8") as f:
        for i, msgs in enumerate(convs):
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}, ensure_ascii=False) + "\n")


def test_sft_pipeline_packs_real_vocabulary_chats(qwen_tok, hf_qwen, tmp_path, monkeypatch):
    convs = THINK_CHATS + trainable(random_conversations(120, seed=11))
    _write_chats(tmp_path / "chats.jsonl", convs)
    seq_len = 384
    expected = {}
    for msgs in convs:
        ids, mask = reference_mask(hf_qwen, msgs)
        expected.setdefault(tuple(ids[:seq_len]), []).append((ids, mask))
    calls = []
    real_tokenize = chat.tokenize_record
    monkeypatch.setattr(chat, "tokenize_record", lambda *a, **k: calls.append(1) or real_tokenize(*a, **k))
    data = build_sft_dataset(open_source(str(tmp_path / "chats.jsonl")), qwen_tok,
                             PipelineConfig(seq_len=seq_len, global_batch_size=4, num_epochs=1, read_threads=2,
                                            vocab_size=151936, max_skip_rate=0.5))
    it = iter(data)
    docs = 0
    for batch in it:
        assert batch["input_ids"].shape == (4, seq_len) and batch["input_ids"].max() < 151665
        for r in range(4):
            for doc in documents_in_row({k: v[r] for k, v in batch.items()}):
                docs += 1
                ids, mask = expected[tuple(doc["input_ids"].tolist())].pop()
                n = len(doc["input_ids"])
                # Next-token targets and masks: loss on position t iff token t+1 is an assistant token.
                assert doc["targets"][:-1].tolist() == ids[1:n]
                assert doc["loss_mask"].tolist() == list(mask[1:n]) + [0]
                assert doc["positions"].tolist() == list(range(n))
    report = skip_report(it)
    assert docs == report.used and report.seen == len(convs)
    assert set(report.skipped) <= {"prompt_too_long"}  # only prompts longer than seq_len may be skipped
    assert report.truncated > 0 and report.used >= len(convs) - report.num_skipped
    # The construction-time probe covered every record; the stream reused its results: one tokenisation each.
    assert data.probe.seen == len(convs) and len(calls) == len(convs)


def test_curriculum_trace_lengths_use_the_real_vocabulary(qwen_tok, hf_qwen, tmp_path):
    convs = THINK_CHATS + trainable(random_conversations(40, seed=5))
    _write_chats(tmp_path / "chats.jsonl", convs)
    source = open_source(str(tmp_path / "chats.jsonl"))
    length = token_trace_length(qwen_tok)
    lengths = [length(source[i]) for i in range(len(source))]
    assert lengths == [sum(len(hf_encode(hf_qwen, m["content"])) for m in c if m["role"] == "assistant")
                       for c in convs]
    cut = sorted(lengths)[len(lengths) // 2]
    rates = {f"c{i}": PassRate(pass_rate=0.0 if i % 2 else 1.0, n=8) for i in range(len(convs))}
    chosen, report = select_hard_subset(source, rates, trace_length=length, min_trace_tokens=cut)
    assert chosen == [i for i in range(len(convs)) if i % 2 and lengths[i] >= cut] and report.selected == len(chosen)


def _stream(tok, ids, chunk):
    dec = tok.stream_decoder(skip_special_tokens=False)
    pieces = [dec.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    return pieces, dec.flush()


def test_streaming_decode_never_emits_half_a_character(qwen_tok, hf_qwen):
    text = "数学 🙂👨‍👩‍👧‍👦 龘靐齉 𠀀𪚥 def f(x):\n    return '🦜'  # 你好\n"
    ids = qwen_tok.encode(text)
    # The text really is split inside characters: some token decodes to a lone part of a UTF-8 sequence.
    assert any("\ufffd" in hf_qwen.decode([i]) for i in ids)
    for chunk in (1, 2, 3):
        pieces, tail = _stream(qwen_tok, ids, chunk)
        assert "".join(pieces) == text and tail == ""
        assert not any("\ufffd" in p for p in pieces)
    # A stream cut inside a character holds the partial bytes back; flush gives what the full decode gives.
    partial = next(k for k in range(1, len(ids)) if hf_qwen.decode(ids[:k]).endswith("\ufffd"))
    pieces, tail = _stream(qwen_tok, ids[:partial], 1)
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) + tail == hf_qwen.decode(ids[:partial])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                                                           max_size=20)), max_size=6).map("".join),
       st.integers(1, 4))
def test_property_streaming_decode(qwen_tok, hf_qwen, text, chunk):
    ids = qwen_tok.encode(text)
    pieces, tail = _stream(qwen_tok, ids, chunk)
    assert "".join(pieces) + tail == hf_qwen.decode(ids)
    if "\ufffd" not in text:
        assert not any("\ufffd" in p for p in pieces) and tail == ""
