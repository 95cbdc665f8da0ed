"""The tokenizer layer: tiny HF and SentencePiece tokenizers, chat template parity with transformers, errors."""
from __future__ import annotations

import json

import pytest

from data_helpers import spm_tok, tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt import VtError
from vt.data.tokenizer import (IM_END, ENDOFTEXT, QWEN_CHAT_TEMPLATE, build_tiny_tokenizer, load_tokenizer,
                               render_qwen_chat)

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "<think>\nGreeting.\n</think>\nHello!"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "a"},
     {"role": "user", "content": "café 数学 🙂"},
     {"role": "assistant", "content": "\n\nleading newlines and trailing spaces  "}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "def f(x):\n    return x * 2\n"}],
]


def test_tiny_tokenizer_round_trip_and_specials(tok):
    text = "<think>\nSo 17_b = b + 7.\n</think>\nThe sum is \\boxed{70}. café 数学 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.token_to_id("<think>") in ids and tok.token_to_id("</think>") in ids  # single tokens
    # Both Qwen stop tokens, by their ids in this tokenizer; padding with <|endoftext|> as Qwen does.
    assert tok.eos_token_ids == tuple(sorted((tok.token_to_id(ENDOFTEXT), tok.token_to_id(IM_END))))
    assert tok.pad_token_id == tok.token_to_id(ENDOFTEXT)
    assert tok.vocab_size == 512
    assert all(0 <= i < tok.vocab_size for i in ids)
    # skip_special_tokens drops ChatML markers but keeps <think> (not special in Qwen2.5).
    chat_ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert tok.decode(chat_ids, skip_special_tokens=True) == "user\nhi\n"
    assert "<think>" in tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("idx", range(len(CHATS)))
def test_chat_template_matches_transformers(tiny_tokenizer_dir, tok, spm_tok, idx, gen):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    msgs = CHATS[idx]
    expected = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    assert tok.apply_chat_template(msgs, add_generation_prompt=gen) == expected
    assert render_qwen_chat(msgs, gen) == expected
    assert spm_tok.apply_chat_template(msgs, add_generation_prompt=gen) == expected  # vt's own template
    ref_ids = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen)
    ref_ids = ref_ids["input_ids"] if isinstance(ref_ids, dict) or hasattr(ref_ids, "keys") else ref_ids
    assert tok.encode_chat(msgs, add_generation_prompt=gen) == list(ref_ids)
    assert ref.eos_token_id == tok.token_to_id(IM_END) and ref.pad_token_id == tok.pad_token_id


def test_qwen_format_literal(tok):
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    assert tok.apply_chat_template(msgs) == "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    assert tok.apply_chat_template(msgs[:1], add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_directory_template_is_used_and_can_be_overridden(tmp_path):
    out = tmp_path / "tok"
    build_tiny_tokenizer(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    # A template with a forced default system prompt, like the official Qwen2.5 one.
    cfg["chat_template"] = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nDEFAULT<|im_end|>\n{% endif %}"
                            + QWEN_CHAT_TEMPLATE)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    msgs = [{"role": "user", "content": "Q"}]
    assert load_tokenizer(out).apply_chat_template(msgs).startswith("<|im_start|>system\nDEFAULT")
    assert load_tokenizer(out, chat_template="qwen").apply_chat_template(msgs) == "<|im_start|>user\nQ<|im_end|>\n"


def test_sentencepiece_tokenizer(spm_tok):
    text = "<|im_start|>assistant\n<think>x</think>café 数学 \\boxed{7}<|im_end|>\n"
    ids = spm_tok.encode(text)
    assert spm_tok.decode(ids) == text
    assert spm_tok.token_to_id(IM_END) in ids
    assert set(spm_tok.eos_token_ids) == {spm_tok.token_to_id(ENDOFTEXT), spm_tok.token_to_id(IM_END)}
    assert spm_tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think>café 数学 \\boxed{7}\n"
    assert spm_tok.token_to_id("no-such-piece") is None
    # Offsets are characters, not bytes, even for multi-byte text.
    ids, offsets = spm_tok.encode_with_offsets("é<|im_end|>")
    assert offsets[-1] == (1, 11)


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(VtError, match=str(tmp_path / "missing")):
        load_tokenizer(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(VtError, match="no tokenizer.json"):
        load_tokenizer(empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(VtError, match=str(bad / "tokenizer.json")):
        load_tokenizer(bad)
    good = tmp_path / "good"
    build_tiny_tokenizer(good)
    (good / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(VtError, match="tokenizer_config.json"):
        load_tokenizer(good)
    model = tmp_path / "x.model"
    model.write_bytes(b"\x00garbage")
    with pytest.raises(VtError, match=str(model)):
        load_tokenizer(model)


@pytest.mark.parametrize("which", ["hf", "spm"])
def test_decode_skips_ids_past_the_vocabulary(tok, spm_tok, which):
    """A padded embedding lets a sampler emit ids the tokenizer has no piece for: both kinds skip them (HF
    tokenizers do so natively; sentencepiece would raise)."""
    t = tok if which == "hf" else spm_tok
    ids = t.encode("hello world")
    assert t.decode(ids + [t.vocab_size, t.vocab_size + 100] + ids) == t.decode(ids + ids)
