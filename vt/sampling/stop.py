"""Stop conditions: which token ids end a sample, and stop strings (checked on the host between decode chunks)."""
from __future__ import annotations

from typing import Callable, Sequence

# Qwen chat ends a turn with <|im_end|> and a document with <|endoftext|>; generation must stop on both.
QWEN_STOP_IDS = (151643, 151645)


def default_stop_ids(vocab_size: int, tokenizer=None, eos_token_id: int | None = None) -> tuple[int, ...]:
    """The tokenizer's eos ids when there is a tokenizer; otherwise the Qwen ids the vocabulary has, plus the
    model config's eos id. May be empty (a tiny test model): then samples end by length only."""
    if tokenizer is not None:
        ids = list(tokenizer.eos_token_ids)
    else:
        ids = [i for i in QWEN_STOP_IDS if i < vocab_size]
        if eos_token_id is not None and eos_token_id < vocab_size:
            ids.append(eos_token_id)
    return tuple(sorted(set(int(i) for i in ids)))


def find_stop_string(ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                     stop_strings: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in the decoded completion, or None.

    Returns (m, text): m is the fewest leading tokens whose text contains that stop string (the completion is
    cut to ids[:m], so its log-probs stay aligned with its tokens) and text is the completion's text cut just
    before the stop string (the stop string itself is not part of the returned text, as in OpenAI/vLLM).
    """
    text = decode(ids)
    hits = [(text.find(s), s) for s in stop_strings if s and s in text]
    if not hits:
        return None
    start, s = min(hits)
    lo, hi = 1, len(ids)  # decode(ids[:hi]) contains s; find the smallest such prefix
    while lo < hi:
        mid = (lo + hi) // 2
        if s in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:start]
