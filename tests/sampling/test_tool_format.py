"""vt.tools without a model: parsing a turn's tool call, the error turns a malformed call gets, output caps, and the
tool turn's text against Qwen2.5's and Qwen3's chat templates (their real tokenizers, token for token)."""
import json

import pytest

from vt.data.qwen_tokenizer import ensure_qwen_tokenizer
from vt.data.tokenizer import build_tiny_tokenizer, load_tokenizer
from vt.sampling.config import ToolsConfig
from vt.tools.format import cap_output, parse_tool_call, tool_turn
from vt.tools.registry import TOOLS, ToolError, tool
from vt.tools.runner import ToolRunner


@tool("echo_tool_test")
def _echo(arguments, cfg):
    return json.dumps(arguments, sort_keys=True)


@tool("raising_tool_test")
def _raises(arguments, cfg):
    raise RuntimeError("boom")


def test_tool_call_parsed_from_the_end_of_a_turn():
    call = parse_tool_call('Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n'
                           '</tool_call>')
    assert (call.name, call.arguments) == ("python", {"code": "print(1)"})
    # the last call of the turn; arguments written as a JSON string are read too
    call = parse_tool_call('<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>'
                           '{"name": "b", "arguments": "{\\"x\\": 2}"}</tool_call>')
    assert (call.name, call.arguments) == ("b", {"x": 2})


@pytest.mark.parametrize("text, message", [
    ('{"name": "python"}</tool_call>', "no <tool_call> opens"),
    ('<tool_call>{"name": "python", "arguments": {"code": }}</tool_call>', "not valid JSON"),
    ('<tool_call>["python"]</tool_call>', "must be a JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
    ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', '"arguments" must be a JSON object'),
    ('<tool_call>{"name": "python", "arguments": "nope"}</tool_call>', '"arguments" must be a JSON object'),
])
def test_tool_call_malformed_is_a_tool_error(text, message):
    with pytest.raises(ToolError, match=message):
        parse_tool_call(text)


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("turn, output, ran", [
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "Error: unknown tool 'nope'; the tools are: "
                                                                  "echo_tool_test, raising_tool_test", False),
    ('<tool_call>{"name": "echo_tool_test", "arguments": {"b": 1, "a": "x"}}</tool_call>', '{"a": "x", "b": 1}', True),
    ('<tool_call>{"name": "raising_tool_test", "arguments": {}}</tool_call>',
     "Error: the tool failed: RuntimeError: boom", False),
    ('<tool_call>{"name": "echo_tool_test" "arguments"}</tool_call>',
     "Error: the tool call is not valid JSON (Expecting ',' delimiter at line 1 column 27)", False),
])
def test_tool_runner_answers_every_call_and_never_raises(tiny_tok, turn, output, ran):
    runner = ToolRunner(ToolsConfig(tools=("echo_tool_test", "raising_tool_test")), tiny_tok)
    assert runner.output(turn) == (output, ran)
    ids, ok = runner.submit(tiny_tok.encode(turn)).result()
    assert ok == ran and tiny_tok.decode(ids) == tool_turn([output])
    runner.close()


def test_tool_runner_refuses_unregistered_tools(tiny_tok):
    with pytest.raises(ToolError, match="unknown tool 'nope'"):
        ToolRunner(ToolsConfig(tools=("nope",)), tiny_tok)
    assert "python" in TOOLS


def test_tool_output_capped_visibly(tiny_tok):
    text = " ".join(str(i) for i in range(200))
    out = cap_output(text, tiny_tok.encode, tiny_tok.decode, 10)
    assert out.startswith(tiny_tok.decode(tiny_tok.encode(text)[:10]))
    assert out.endswith(f"[output truncated: {len(tiny_tok.encode(text)) - 10} more tokens]")
    assert cap_output("short", tiny_tok.encode, tiny_tok.decode, 10) == "short"


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3"])
def test_tool_turns_equal_the_chat_template_rendering(family):
    """A conversation with two tool calls, rendered by the tokenizer's own chat template, is token for token the
    prompt + each policy turn (ending </tool_call>) + tool_turn(...) + the final answer, as the sampler builds it."""
    tok = load_tokenizer(ensure_qwen_tokenizer(family))
    calls = [{"code": "print(12*34)"}, {"code": "x = 2**10\nprint(x)"}]
    outputs, contents = ["408", "1024\n"], ["I will compute it.", ""]
    messages = [{"role": "user", "content": "What is 12*34 and 2**10?"}]
    for c, out, content in zip(calls, outputs, contents):
        messages += [{"role": "assistant", "content": content,
                      "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": c}}]},
                     {"role": "tool", "content": out}]
    messages.append({"role": "assistant", "content": "408 and 1024."})
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True)
    sampled = prompt
    for c, out, content in zip(calls, outputs, contents):
        call = json.dumps({"name": "python", "arguments": c}, ensure_ascii=False)
        lead = content + "\n" if content else ""
        sampled += f"{lead}<tool_call>\n{call}\n</tool_call>" + tool_turn([out])
    sampled += "408 and 1024.<|im_end|>\n"
    rendered = tok.apply_chat_template(messages)
    if family == "qwen3":  # Qwen3 closes an empty think block in the last assistant turn
        sampled = sampled.replace("<|im_start|>assistant\n408", "<|im_start|>assistant\n<think>\n\n</think>\n\n408")
    assert rendered == sampled
    assert tok.encode(rendered) == tok.encode(sampled)
