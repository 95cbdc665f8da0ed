"""Fixtures and helpers shared by the data tests: tiny tokenizers trained on the spot (no downloads, no
binary files), JSONL writers, synthetic chats.

Not a conftest.py on purpose: other test folders do `from conftest import ...`, which a second conftest
module would shadow. Test modules import the fixtures they use from here.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vt.data.tokenizer import build_tiny_sentencepiece, build_tiny_tokenizer, load_tokenizer

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """An HF tokenizer directory (byte-level BPE, Qwen specials, Qwen chat template)."""
    path = tmp_path_factory.mktemp("tiny_tok")
    build_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tok(tiny_tokenizer_dir):
    return load_tokenizer(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def spm_tok(tmp_path_factory):
    """A SentencePiece model with the Qwen specials as user-defined symbols."""
    return build_tiny_sentencepiece(tmp_path_factory.mktemp("tiny_spm") / "tiny.model")


@pytest.fixture(scope="session")
def aime25_path() -> Path:
    return ASSETS / "aime25.parquet"


def write_jsonl(path: Path, lines: list) -> Path:
    """Each item: a dict/list (dumped as JSON), a str (written as is) or bytes (written raw)."""
    with open(path, "wb") as f:
        for x in lines:
            if isinstance(x, (dict, list)):
                x = json.dumps(x, ensure_ascii=False)
            f.write((x.encode("utf-8") if isinstance(x, str) else x) + b"\n")
    return path


def chat(i: int, n_words: int = 3, user: str | None = None) -> dict:
    """A small deterministic chat record with a distinct id and assistant content."""
    return {"id": f"r{i}", "messages": [
        {"role": "user", "content": user if user is not None else f"What is {i} + {i}?"},
        {"role": "assistant", "content": f"<think>\n{i} plus {i}\n</think>\n" + " ".join(["so"] * n_words)
                                         + f" the answer is \\boxed{{{2 * i}}}."},
    ]}
