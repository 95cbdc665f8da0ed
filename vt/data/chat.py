"""Records -> token ids and loss masks (assistant tokens only), with over-length policy and id checks.

Token-level convention (``token_mask``): ``token_mask[t] = 1`` iff token ``t`` belongs to an assistant turn's
*content or its closing end-of-turn token* (``<|im_end|>`` in ChatML), so the model learns to stop. The
``<|im_start|>assistant\\n`` header, the ``\\n`` after ``<|im_end|>``, system/user/tool turns are 0. An assistant
turn's tool calls (its ``tool_calls``, rendered by the template as ``<tool_call>...</tool_call>``) are trained on
like its content; the ``tool`` turns answering them are not (what the sampler puts between the policy's turns).
``<think>...</think>`` is part of the content and is trained on (reasoning traces are kept whole), as the chat
template renders it (Qwen3's normalises the block and drops it from turns before the last user query; with its
``enable_thinking=False`` the empty block is part of the generation prompt, so it is not trained on).

Training-example convention (what packing consumes, see :func:`to_training_example`): next-token targets
``targets[t] = input_ids[t+1]`` and ``loss_mask[t] = token_mask[t+1]`` for ``t < L-1``; the last position
has no target (``targets = pad``, ``loss_mask = 0``), so a packed row never predicts across documents.

How the mask is found: the chat is rendered to text once and tokenised once (so ids equal what
``encode_chat`` gives), each assistant content is located by rendering the conversation up to that turn
(with the generation prompt), and every token whose first character lies in
``[content_start, content_end + len(<|im_end|>))`` is marked (see :func:`assistant_spans`).
A token that straddles the header/content boundary starts in the header and is not trained on.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from vt import VtError
from vt.data.sources import Malformed, Record
from vt.data.tokenizer import IM_END, Tokenizer

TRUNCATE_RIGHT = "truncate_right"
DROP = "drop"
OVERLONG_POLICIES = (TRUNCATE_RIGHT, DROP)

# Skip reasons added at tokenisation (the sources add malformed_json, invalid_utf8, missing_field, ...).
NO_ASSISTANT_TURN = "no_assistant_turn"
TOO_LONG = "too_long"  # over max_len under the `drop` policy
PROMPT_TOO_LONG = "prompt_too_long"  # under `truncate_right`, no assistant token left inside the window
TOKEN_OUT_OF_RANGE = "token_out_of_range"
TOO_SHORT = "too_short"  # fewer than 2 tokens: no next-token target at all
TEMPLATE_MISMATCH = "template_mismatch"  # the chat template altered assistant content; cannot mask it


# A record rejected at tokenisation: the same (reason, where, detail) as a source's Malformed item, so the
# pipeline counts both kinds under their reasons with one check.
Skip = Malformed


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """A record as tokens. ``token_mask`` follows the token-level convention of the module docstring."""

    input_ids: np.ndarray  # int32 [L]
    token_mask: np.ndarray  # int8 [L]
    truncated: bool = False
    where: str = ""


def assistant_spans(tokenizer: Tokenizer, messages, text: str,
                    end_marker: str = IM_END) -> list[tuple[int, int]] | None:
    """Character spans of each assistant turn's rendering (+ the end marker right after it) in ``text``.

    The rendering of assistant turn ``i`` starts right after ``render(messages[:i], add_generation_prompt=True)``,
    which must be a prefix of the full rendering (true of ChatML, Qwen3's and every incremental template).
    Anchoring on rendered prefixes, not on searching for the content, keeps short contents ("a", "4") from
    matching inside earlier headers. The rendering is the content itself (ChatML, Qwen2.5) or, for a template
    that re-renders the reasoning, the text up to the end marker, which must end with the content's answer
    (what follows its last ``</think>``): Qwen3's writes the ``<think>`` block with its own newlines, an empty
    one into a final turn that has none, and none into turns before the last user query. What the template
    renders is what the model is trained to write. Returns None when the template breaks the prefix property or
    changes an answer.
    """
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True)
        if not text.startswith(prefix) and tokenizer.enable_thinking is False:
            # Qwen3's generation prompt with thinking off opens the turn with an empty <think> block, which the
            # full rendering holds for the last turn only; earlier turns start after the bare header.
            prefix = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, enable_thinking=True)
        start = len(prefix)
        if not text.startswith(prefix):
            return None
        if m.get("tool_calls"):
            # A tool-calling turn: its content and the calls as the template writes them, to the end marker. A
            # template without a tool-calling branch (vt's ChatML) drops the calls: nothing to train on, refused.
            end = text.find(end_marker, start)
            turn = text[start:end]
            if end < 0 or not turn.startswith(m["content"]) or any(
                    f'"{c["function"]["name"]}"' not in turn for c in m["tool_calls"]):
                return None
        elif text.startswith(m["content"], start):
            end = start + len(m["content"])
        else:
            end = text.find(end_marker, start)
            answer = m["content"].rsplit("</think>", 1)[-1].strip()
            if end < 0 or not text[start:end].rstrip().endswith(answer):
                return None
        if text.startswith(end_marker, end):
            end += len(end_marker)
        spans.append((start, end))
    return spans


def chat_token_mask(tokenizer: Tokenizer, messages) -> tuple[list[int], np.ndarray] | None:
    """Tokenise a full chat; returns ``(ids, token_mask)`` or None if assistant content cannot be located."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    spans = assistant_spans(tokenizer, messages, text)
    if spans is None:
        return None
    ids, offsets = tokenizer.encode_with_offsets(text)
    starts = np.fromiter((o[0] for o in offsets), dtype=np.int64, count=len(offsets))
    mask = np.zeros(len(ids), dtype=np.int8)
    for s, e in spans:
        mask[(starts >= s) & (starts < e)] = 1
    return ids, mask


def tokenize_record(record: Record | Malformed, tokenizer: Tokenizer, *, max_len: int,
                    overlong: str = TRUNCATE_RIGHT, vocab_size: int | None = None) -> Tokenized | Skip:
    """Turn a record into tokens + token mask, or a :class:`Skip` with a reason and ``where``.

    ``max_len``: the packing row length; longer examples are cut to the first ``max_len`` tokens
    (``truncate_right``; a cut response loses its ``<|im_end|>`` and so does not teach stopping) or skipped
    (``drop``). ``vocab_size``: the model's embedding rows; any id outside ``[0, vocab_size)`` skips the
    record (default: the tokenizer's vocabulary), so a tokenizer/model mismatch cannot index out of range.
    """
    if overlong not in OVERLONG_POLICIES:
        raise VtError(f"overlong policy {overlong!r}: expected one of {OVERLONG_POLICIES}")
    if isinstance(record, Malformed):
        return record
    if record.input_ids is not None:
        ids, mask = list(record.input_ids), np.asarray(record.loss_mask, dtype=np.int8)
    else:
        if not any(m["role"] == "assistant" for m in record.messages):
            return Skip(NO_ASSISTANT_TURN, record.where, "no assistant message to train on")
        out = chat_token_mask(tokenizer, record.messages)
        if out is None:
            return Skip(TEMPLATE_MISMATCH, record.where, "chat template changed a message's content")
        ids, mask = out
    vocab = tokenizer.vocab_size if vocab_size is None else vocab_size
    arr = np.asarray(ids, dtype=np.int64)
    bad = (arr < 0) | (arr >= vocab)
    if bad.any():
        t = int(np.argmax(bad))
        return Skip(TOKEN_OUT_OF_RANGE, record.where, f"token {t} has id {int(arr[t])}, vocab size is {vocab}")
    truncated = False
    if len(arr) > max_len:
        if overlong == DROP:
            return Skip(TOO_LONG, record.where, f"{len(arr)} tokens > max_len {max_len}")
        arr, mask, truncated = arr[:max_len], mask[:max_len], True
    if len(arr) < 2:
        return Skip(TOO_SHORT, record.where, f"{len(arr)} token(s): no next-token target")
    # Position 0 can never be a target, so the example is useful only if a masked token sits at t >= 1.
    if not mask[1:].any():
        reason = PROMPT_TOO_LONG if truncated else NO_ASSISTANT_TURN
        return Skip(reason, record.where, f"no assistant token within the first {len(arr)} tokens")
    return Tokenized(arr.astype(np.int32), mask.astype(np.int8), truncated, record.where)


def to_training_example(tok: Tokenized, pad_id: int) -> dict[str, np.ndarray]:
    """Shift to next-token form: ``targets[t] = ids[t+1]``, ``loss_mask[t] = token_mask[t+1]``; last = pad/0."""
    ids = tok.input_ids
    targets = np.empty_like(ids)
    targets[:-1], targets[-1] = ids[1:], pad_id
    loss_mask = np.zeros(len(ids), dtype=np.float32)
    loss_mask[:-1] = tok.token_mask[1:]
    return {"input_ids": ids, "targets": targets, "loss_mask": loss_mask}

