"""`vt demo --variant tools` (issue 52): its data stage writes the tool task (vt.data.tasks.tool_record) and a
tokenizer whose chat template renders a tool-calling trace as the sampler writes it, so SFT trains on the calls
and answers and never on the tool's output. The run (to sft1) is shared with tests/rl/test_tool_learning.py, which trains
on it with RL."""

import json

import numpy as np

from testutil import tool_demo_sft1
from vt.data.chat import tokenize_record
from vt.data.sources import record_from_dict
from vt.data.tokenizer import load_tokenizer
from vt.tools.format import tool_turn


def test_tools_demo_data_renders_tool_turns_as_the_sampler():
    data = tool_demo_sft1() / "data"
    tok = load_tokenizer(data / "tokenizer")
    assert tok.vocab_size == 512  # the tiny model's: every id it samples decodes
    sft = [json.loads(x) for x in (data / "sft.jsonl").read_text().splitlines()]
    calling = [r for r in sft if any("tool_calls" in m for m in r["messages"])]
    assert 0.3 < len(calling) / len(sft) < 0.7  # noise 0.5: the others guess without the tool
    rec = calling[0]
    m = rec["messages"]
    out = tokenize_record(record_from_dict(rec, where="sft.jsonl", default_id="0"), tok, max_len=128)
    code = m[2]["tool_calls"][0]["function"]["arguments"]["code"]
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "' + code + '"}}\n</tool_call>'
    prompt = tok.apply_chat_template(m[:2], add_generation_prompt=True)
    assert tok.decode(out.input_ids) == prompt + call + tool_turn([m[3]["content"]]) + m[4]["content"] + \
        "<|im_end|>\n"
    edges = np.flatnonzero(np.diff(np.concatenate([[0], out.token_mask, [0]])))
    trained = [tok.decode(out.input_ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]
    assert trained == [call + "<|im_end|>", m[4]["content"] + "<|im_end|>"]
    assert len(out.input_ids) <= 128  # the variant's SFT seq_len holds a whole trace
    for name in ("rl_tools.jsonl", "heldout_tools.jsonl"):
        first = json.loads((data / name).read_text().splitlines()[0])
        assert [x["role"] for x in first["messages"]] == ["system", "user"] and first["domain"] == "math"
