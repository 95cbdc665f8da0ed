"""SFT data with tool turns (issue 52): a chat whose assistant turns call tools (`tool_calls`) and whose `tool`
turns answer them trains on the assistant turns only, calls included, and renders token for token as the
sampler's multi-turn samples (the policy's call, then vt.tools.format.tool_turn)."""

import numpy as np
import pytest

from vt.data.chat import TEMPLATE_MISMATCH, tokenize_record
from vt.data.qwen_tokenizer import QWEN25_CHAT_TEMPLATE
from vt.data.sources import BAD_MESSAGE, Malformed, record_from_dict
from vt.data.tokenizer import build_tiny_tokenizer
from vt.tools.format import tool_turn

CODE = "print(123456789 * 987654321)"
OUTPUT = "121932631112635269"
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "' + CODE + '"}}\n</tool_call>'
FINAL = "\\boxed{121932631112635269}"


def chat(thought: str = "") -> list[dict]:
    return [{"role": "system", "content": "Use the python tool."},
            {"role": "user", "content": "123456789*987654321"},
            {"role": "assistant", "content": thought,
             "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": CODE}}}]},
            {"role": "tool", "content": OUTPUT},
            {"role": "assistant", "content": FINAL}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    texts = [CALL, OUTPUT, FINAL, "<tool_response>", "Use the python tool.", "Let me compute."] * 5
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tool_tok") / "tok", texts, vocab_size=400,
                                chat_template=QWEN25_CHAT_TEMPLATE)


def trained_spans(ids, mask, tok) -> list[str]:
    """The text of each run of trained tokens."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [tok.decode(ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]


@pytest.mark.parametrize("thought", ["", "Let me compute."])
def test_tool_calls_are_trained_and_tool_turns_are_not(tok, thought):
    messages = chat(thought)
    rec = record_from_dict({"messages": messages}, where="t.jsonl:1", default_id="0")
    out = tokenize_record(rec, tok, max_len=1024)
    ids, mask = out.input_ids, out.token_mask
    policy_call = (thought + "\n" if thought else "") + CALL
    # What the sampler makes of the same conversation: the prompt, the policy's call, the tool turn, the answer.
    prompt = tok.apply_chat_template(messages[:2], add_generation_prompt=True)
    assert tok.decode(ids) == prompt + policy_call + tool_turn([OUTPUT]) + FINAL + "<|im_end|>\n"
    assert ids.tolist() == tok.encode_chat(messages)
    assert trained_spans(ids, mask, tok) == [policy_call + "<|im_end|>", FINAL + "<|im_end|>"]


def test_tool_calls_under_a_template_without_them_are_refused(tmp_path):
    """vt's ChatML drops an assistant turn's tool_calls: the record is skipped (template_mismatch), not trained
    as an empty turn."""
    plain = build_tiny_tokenizer(tmp_path / "tok", [CALL, OUTPUT, FINAL] * 5, vocab_size=400)
    rec = record_from_dict({"messages": chat()}, where="t.jsonl:1", default_id="0")
    out = tokenize_record(rec, plain, max_len=1024)
    assert isinstance(out, Malformed) and out.reason == TEMPLATE_MISMATCH


@pytest.mark.parametrize("calls", [[], "python", [{"function": {"name": "python", "arguments": "x"}}],
                                   [{"function": {"arguments": {}}}]])
def test_malformed_tool_calls_are_named(calls):
    messages = chat()
    messages[2]["tool_calls"] = calls
    rec = record_from_dict({"messages": messages}, where="t.jsonl:7", default_id="0")
    assert isinstance(rec, Malformed) and rec.reason == BAD_MESSAGE and "messages[2].tool_calls" in rec.detail
