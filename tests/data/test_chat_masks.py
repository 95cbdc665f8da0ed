"""Tokenisation and loss masks: assistant tokens only (+ their <|im_end|>), <think> kept, policies, id checks."""
from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from data_helpers import spm_tok, tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt.data.chat import Skip, Tokenized, to_training_example, tokenize_record
from vt.data.sources import Record, record_from_dict

MULTI = (
    {"role": "system", "content": "You are a careful solver."},
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": "<think>\na is a letter\n</think>\na"},
    {"role": "user", "content": "And 4?"},
    {"role": "assistant", "content": "4"},
)


def _masked_text(tokenizer, tok: Tokenized) -> list[str]:
    """Decode each maximal run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(tok.input_ids, tok.token_mask):
        if m:
            cur.append(int(i))
        elif cur:
            runs.append(tokenizer.decode(cur))
            cur = []
    if cur:
        runs.append(tokenizer.decode(cur))
    return runs


@pytest.mark.parametrize("which", ["hf", "spm"])
def test_mask_covers_exactly_assistant_turns(tok, spm_tok, which):
    t = tok if which == "hf" else spm_tok
    out = tokenize_record(Record(id="m", messages=MULTI), t, max_len=512)
    assert isinstance(out, Tokenized) and not out.truncated
    assert list(out.input_ids) == t.encode_chat(MULTI)  # one tokenisation, same as inference
    assert _masked_text(t, out) == ["<think>\na is a letter\n</think>\na<|im_end|>", "4<|im_end|>"]
    # Everything else (system, user turns, the assistant headers, the trailing newlines) is unmasked.
    unmasked = t.decode([i for i, m in zip(out.input_ids, out.token_mask) if not m])
    assert unmasked == ("<|im_start|>system\nYou are a careful solver.<|im_end|>\n<|im_start|>user\na<|im_end|>\n"
                        "<|im_start|>assistant\n\n<|im_start|>user\nAnd 4?<|im_end|>\n<|im_start|>assistant\n\n")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(turns=[("", "\u0f73")])  # found by CI: NFC decomposes it, the mask is still right
@given(turns=st.lists(st.tuples(st.text(max_size=12), st.text(min_size=1, max_size=12).filter(str.strip)),
                      min_size=1, max_size=3))
def test_mask_property_random_text(tok, turns):
    msgs = []
    for u, a in turns:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    out = tokenize_record(Record(id="h", messages=tuple(msgs)), tok, max_len=10_000)
    assert isinstance(out, Tokenized)
    # Each masked run decodes to one assistant content + <|im_end|>. The only allowed loss: leading whitespace
    # that the pre-tokeniser merged with the header's "\n" into one token starting in the header. The text is
    # compared after NFC, which the Qwen tokenizer's normaliser applies (U+0F73 comes back as U+0F71 U+0F72).
    runs = _masked_text(tok, out)
    assert len(runs) == len(turns)
    for run, (_, a) in zip(runs, turns):
        want = unicodedata.normalize("NFC", a) + "<|im_end|>"
        assert want.endswith(run) and want[: len(want) - len(run)].strip() == ""


def test_training_example_shift(tok):
    out = tokenize_record(Record(id="m", messages=MULTI), tok, max_len=512)
    ex = to_training_example(out, tok.pad_token_id)
    ids, tgt, lm = ex["input_ids"], ex["targets"], ex["loss_mask"]
    assert tgt.dtype == np.int32 and lm.dtype == np.float32
    np.testing.assert_array_equal(tgt[:-1], ids[1:])
    assert tgt[-1] == tok.pad_token_id and lm[-1] == 0.0
    np.testing.assert_array_equal(lm[:-1], out.token_mask[1:].astype(np.float32))
    # The trained targets are exactly the assistant tokens.
    assert tok.decode(tgt[lm > 0]) == "<think>\na is a letter\n</think>\na<|im_end|>4<|im_end|>"


def test_overlong_policies(tok):
    rec = Record(id="long", where="f.jsonl:3", messages=(
        {"role": "user", "content": "short question"}, {"role": "assistant", "content": "word " * 200}))
    n = len(tok.encode_chat(rec.messages))
    cut = tokenize_record(rec, tok, max_len=40, overlong="truncate_right")
    assert cut.truncated and len(cut.input_ids) == 40
    assert list(cut.input_ids) == tok.encode_chat(rec.messages)[:40]
    dropped = tokenize_record(rec, tok, max_len=40, overlong="drop")
    assert isinstance(dropped, Skip) and dropped.reason == "too_long" and f"{n} tokens" in dropped.detail
    assert dropped.where == "f.jsonl:3"
    long_prompt = Record(id="lp", where="f.jsonl:4", messages=(
        {"role": "user", "content": "question " * 100}, {"role": "assistant", "content": "ok"}))
    s = tokenize_record(long_prompt, tok, max_len=40)
    assert isinstance(s, Skip) and s.reason == "prompt_too_long"


def test_out_of_range_and_other_skips(tok):
    pre = record_from_dict({"input_ids": [1, 2, 3, 999_999], "loss_mask": [0, 0, 1, 1]}, where="p.jsonl:1",
                           default_id="p")
    s = tokenize_record(pre, tok, max_len=64)
    assert s.reason == "token_out_of_range" and "999999" in s.detail and s.where == "p.jsonl:1"
    # A model vocabulary smaller than the tokenizer's is caught too.
    rec = Record(id="x", messages=({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}))
    assert tokenize_record(rec, tok, max_len=64, vocab_size=100).reason == "token_out_of_range"
    prompt_only = Record(id="q", messages=({"role": "user", "content": "hi"},))
    assert tokenize_record(prompt_only, tok, max_len=64).reason == "no_assistant_turn"
    ok = tokenize_record(record_from_dict({"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, where="w", default_id="i"),
                         tok, max_len=64)
    assert isinstance(ok, Tokenized) and list(ok.token_mask) == [0, 1, 1]


@pytest.fixture(scope="module")
def qwen3_template_tok(tiny_tokenizer_dir):
    from vt.data.qwen_tokenizer import QWEN3_CHAT_TEMPLATE
    from vt.data.tokenizer import load_tokenizer
    return lambda **kw: load_tokenizer(tiny_tokenizer_dir, chat_template=QWEN3_CHAT_TEMPLATE, **kw)


def test_qwen3_template_masks_what_it_renders(qwen3_template_tok):
    """Qwen3's template drops the reasoning of turns before the last user query and writes the last turn's
    <think> block with its own newlines (an empty one when the turn has none): the mask covers each turn as
    rendered, and with enable_thinking=False the empty block belongs to the prompt, not to the trained tokens."""
    t = qwen3_template_tok()
    out = tokenize_record(Record(id="m", messages=MULTI), t, max_len=512)
    assert list(out.input_ids) == t.encode_chat(MULTI)
    assert _masked_text(t, out) == ["a<|im_end|>", "<think>\n\n</think>\n\n4<|im_end|>"]
    one = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r</think>ans"})
    assert _masked_text(t, tokenize_record(Record(id="o", messages=one), t, max_len=512)) == [
        "<think>\nr\n</think>\n\nans<|im_end|>"]

    off = qwen3_template_tok(enable_thinking=False)
    out = tokenize_record(Record(id="m", messages=MULTI), off, max_len=512)
    assert _masked_text(off, out) == ["a<|im_end|>", "4<|im_end|>"]
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n" in off.decode(out.input_ids[out.token_mask == 0])
    prompt = off.encode_chat(MULTI[:4], add_generation_prompt=True)  # what an RL rollout is sampled from
    assert off.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert t.decode(t.encode_chat(MULTI[:4], add_generation_prompt=True)).endswith("<|im_start|>assistant\n")

