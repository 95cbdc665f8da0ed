"""Qwen's tool-call format: the call a policy turn ends with, and the `tool` turn that answers it.

The policy writes `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (the chat templates of Qwen2.5 and
Qwen3 tell it to, and render an assistant turn's tool_calls so). The sampler stops the turn at `</tool_call>` and
appends `tool_turn(...)`: the rest of that assistant turn (`<|im_end|>`), the tool turn (a user turn holding
`<tool_response>` blocks, as both templates render role "tool") and the next assistant turn's generation prompt,
so a finished multi-turn sample is token for token the template's rendering of the conversation.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

from vt.tools.registry import ToolError

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def parse_tool_call(turn_text: str) -> ToolCall:
    """The call that ends `turn_text` (a policy turn ending `</tool_call>`): the JSON between the last
    `<tool_call>` and that end. ToolError with what the policy got wrong: no opening tag, not JSON, not an object
    with a string "name" and an object "arguments" (a JSON string holding one, as some models write, is read too)."""
    body = turn_text.rstrip()
    if body.endswith(CALL_END):
        body = body[:-len(CALL_END)]
    start = body.rfind(CALL_START)
    if start < 0:
        raise ToolError(f"no {CALL_START} opens the call that {CALL_END} closes")
    body = body[start + len(CALL_START):].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        raise ToolError(f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(call, dict):
        raise ToolError('the tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name, arguments = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ToolError('the tool call has no "name" string')
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ToolError('"arguments" must be a JSON object') from None
    if not isinstance(arguments, dict):
        raise ToolError('"arguments" must be a JSON object')
    return ToolCall(name, arguments)


def tool_turn(outputs: Sequence[str]) -> str:
    """The text after a policy turn's `</tool_call>`: the end of that assistant turn, one tool turn with a
    `<tool_response>` per output, and the generation prompt of the next assistant turn."""
    responses = "".join(f"\n<tool_response>\n{out}\n</tool_response>" for out in outputs)
    return f"{IM_END}\n{IM_START}user{responses}{IM_END}\n{IM_START}assistant\n"


def error_output(message: str) -> str:
    """What the policy reads for a call that could not run."""
    return f"Error: {message}"


def cap_output(text: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
               max_tokens: int) -> str:
    """`text` cut to its first `max_tokens` tokens, with a visible note of what was cut."""
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text
    return f"{decode(ids[:max_tokens])}\n... [output truncated: {len(ids) - max_tokens} more tokens]"
