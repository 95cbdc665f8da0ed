"""Tool calls inside the sampler, end to end: a tiny model trained to call the `python` tool (bench/tool_policy.py)
samples multi-turn rollouts whose calls run in the sandbox. Checked: the tokens are the conversation's (policy
turns and tool turns, with the mask between them), a greedy run equals a reference that re-prefills the whole
conversation every turn (the kept KV prefix is right), the sampler's log-probs equal a full forward pass's on the
policy tokens, results do not depend on batch size, pool size (parked samples evicted, running ones preempted)
or steps per call, max_turns and the token budget end samples, `vt sample --tool python` writes the masks, a tool's
output never matches a stop string, and Engine.close ends the tool threads."""
import functools
import json
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from testutil import REPO, build_once, run_vt
from vt.checkpoint.params import load_model, save_model
from vt.data.tokenizer import build_tiny_tokenizer
from vt.sampling.config import Request, SamplerConfig, ToolsConfig
from vt.sampling.engine import Engine
from vt.sampling.rules import SamplingParams, sampling_logprobs
from vt.sampling.stop import find_stop_string
from vt.tools.format import tool_turn
from vt.tools.runner import ToolRunner

sys.path.insert(0, str(REPO / "bench"))
import tool_policy  # noqa: E402

MAX_NEW = 320


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tool_tok"))  # deterministic: the same in every worker


@pytest.fixture(scope="module")
def policy_ckpt(tok, shared_dir):
    def train(d):
        save_model(d / "ck", tool_policy.tool_policy(tok, n_traces=2, calls=2)[0])
    return build_once("tool_policy", train) / "ck"


@pytest.fixture(scope="module")
def policy(policy_ckpt):
    return load_model(policy_ckpt)


@pytest.fixture(scope="module")
def data(tok):
    return tool_policy.traces(2, 2)


def _engine(model, tok, **kw):
    tools = kw.pop("tools", ToolsConfig())
    return Engine(model, SamplerConfig(**{"batch_size": 4, "max_new_tokens": MAX_NEW, "temperature": 0.0,
                                          "tools": tools, **kw}), tokenizer=tok)


def _requests(tok, data, extra=()):
    return [Request(tok.encode(p)) for p, _, _ in data] + [Request(tok.encode(p)) for p in extra]


# Prompts the model was not trained on: its turns go off script (malformed calls get error turns).
OFF_SCRIPT = ["<|im_start|>user\nSum of 12*7?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def greedy(policy, tok, data):
    eng = _engine(policy, tok)
    return eng.generate(_requests(tok, data, OFF_SCRIPT)), eng.last_stats


def test_tool_rollout_is_the_conversation_with_policy_mask(greedy, tok, data):
    out, stats = greedy
    assert stats.tool_calls >= 4
    for (prompt, turns, outputs), [s] in zip(data, out):
        ids, mask = [], []
        for k, turn in enumerate(turns):
            ids += tok.encode(turn)
            mask += [True] * len(tok.encode(turn))
            if k < len(outputs):
                ids += tok.encode(tool_turn([outputs[k]]))  # outputs: what the sandbox printed
                mask += [False] * len(tok.encode(tool_turn([outputs[k]])))
        assert s.completion_ids == ids
        assert s.policy_mask.tolist() == mask
        assert (s.finish_reason, s.tool_calls, s.tool_errors) == ("stop", 2, 0)
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, mask) if not m) and len(s.logprobs) == len(ids)
        assert s.text == tool_policy.render("", turns, outputs).replace("<|im_end|>", "").replace("<|im_start|>", "")


def _reference(model, tok, prompt_ids, runner):
    """Greedy multi-turn by hand: generate without tools up to </tool_call>, run the call, re-prefill the whole
    conversation, repeat."""
    eng = Engine(model, SamplerConfig(batch_size=1, max_new_tokens=MAX_NEW, temperature=0.0,
                                      stop_strings=("</tool_call>",)), tokenizer=tok)
    seq, calls = list(prompt_ids), 0
    while True:
        left = MAX_NEW - (len(seq) - len(prompt_ids))
        [[s]] = eng.generate([Request(seq, max_new_tokens=left)])
        seq += s.completion_ids
        if s.finish_reason != "stop" or "</tool_call>" not in tok.decode(s.completion_ids) or calls == 4:
            return seq[len(prompt_ids):], calls
        ids, _ = runner.respond(s.completion_ids)
        seq += ids[:MAX_NEW - (len(seq) - len(prompt_ids))]
        calls += 1
        if len(seq) - len(prompt_ids) >= MAX_NEW:
            return seq[len(prompt_ids):], calls


def test_tool_greedy_multi_turn_equals_reprefilling_reference(greedy, policy, tok, data):
    out, _ = greedy
    runner = ToolRunner(ToolsConfig(), tok)
    for req, [s] in zip(_requests(tok, data, OFF_SCRIPT), out):
        ids, calls = _reference(policy, tok, req.prompt_ids, runner)
        assert s.completion_ids == ids and s.tool_calls == calls
    runner.close()


@pytest.fixture(scope="module")
def sampled(policy, tok, data):
    eng = _engine(policy, tok, temperature=1.0, n=2, seed=5)
    return eng.generate(_requests(tok, data, OFF_SCRIPT)), eng


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens):
    return nnx.merge(graphdef, state)(tokens)[0]


def test_tool_sampler_logprobs_equal_a_full_forward_on_policy_tokens(sampled, policy, tok, data):
    out, eng = sampled
    params = SamplingParams(1.0, 1.0, -1)
    reqs = _requests(tok, data, OFF_SCRIPT)
    assert sum(s.tool_calls for g in out for s in g) >= 4
    width = MAX_NEW + max(len(r.prompt_ids) for r in reqs)
    for req, group in zip(reqs, out):
        for s in group:
            seq = list(req.prompt_ids) + s.completion_ids
            # right-padded to one width (causal: the padding cannot change earlier positions), one compile
            logits = np.asarray(_forward(*nnx.split(policy), jnp.asarray([seq + [0] * (width - len(seq))])))[0]
            L = len(req.prompt_ids)
            logq = np.asarray(sampling_logprobs(jnp.asarray(logits[L - 1:len(seq) - 1]), params))
            want = logq[np.arange(len(s.completion_ids)), s.completion_ids]
            mask = s.policy_mask if s.policy_mask is not None else np.ones(len(seq) - L, bool)
            np.testing.assert_allclose(np.asarray(s.logprobs)[mask], want[mask], atol=1e-4)
            assert not np.any(np.asarray(s.logprobs)[~mask])


def test_tool_samples_do_not_depend_on_batch_pool_or_steps_per_call(sampled, policy, tok, data):
    """Two slots and a pool too small for the samples: parked samples give their kept pages back
    (parked_evictions) and running samples past a tool turn are preempted (tool_preemptions); each comes back by
    re-prefilling its whole sequence (resume_tokens count it), no call runs twice, and every sample's tokens and
    mask are those of the roomy run."""
    out, roomy = sampled
    ids = lambda res: [[(s.completion_ids, s.policy_mask.tolist() if s.policy_mask is not None else None)  # noqa: E731
                        for s in g] for g in res]
    eng = _engine(policy, tok, temperature=1.0, n=2, seed=5, batch_size=2, kv_pages=22, steps_per_call=7)
    small = eng.generate(_requests(tok, data, OFF_SCRIPT))
    st = eng.last_stats
    assert st.parked_evictions > 0 and st.tool_preemptions > 0  # measured: 6 and 4
    assert st.tool_calls == roomy.last_stats.tool_calls
    assert st.resume_tokens > roomy.last_stats.resume_tokens
    assert ids(small) == ids(out)


def test_tool_max_turns_and_token_budget_end_samples(greedy, policy, tok, data):
    [[full], _, _] = greedy[0]
    _, turns, outputs = data[0]
    first = len(tok.encode(turns[0]))
    tool1 = len(tok.encode(tool_turn([outputs[0]])))
    eng = _engine(policy, tok, tools=ToolsConfig(max_turns=1))
    [[s]] = eng.generate(_requests(tok, data[:1]))
    second = first + tool1 + len(tok.encode(turns[1]))
    assert (s.finish_reason, s.tool_calls, s.completion_ids) == ("max_turns", 1, full.completion_ids[:second])
    # the budget runs out inside the tool turn: what fits of it, masked, then "length"
    [[s]] = eng.generate([Request(tok.encode(data[0][0]), max_new_tokens=first + 5)])
    assert (s.finish_reason, s.completion_ids) == ("length", full.completion_ids[:first + 5])
    assert s.policy_mask.tolist() == [True] * first + [False] * 5


def test_tool_vt_sample_cli_writes_masks(policy_ckpt, tok, data, tmp_path):
    tok_dir = tmp_path / "tok"
    build_tiny_tokenizer(tok_dir)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": data[0][0]}) + "\n")
    out = tmp_path / "o.jsonl"
    run_vt("sample", "--ckpt", str(policy_ckpt), "--prompts", str(prompts), "--out", str(out), "--tokenizer",
           str(tok_dir), "--temperature", "0", "--max-new-tokens", str(MAX_NEW), "--tool", "python",
           "--no-progress", check=True)
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["tool_calls"] == 2 and rec["finish_reason"] == "stop"
    mask = rec["policy_mask"]
    assert len(mask) == len(rec["completion_ids"]) and 0 < sum(mask) < len(mask)
    assert rec["completion"].endswith(f"The answer is {sum(int(o) for o in data[0][2])}.")
    r = run_vt("sample", "--ckpt", str(policy_ckpt), "--prompts", str(prompts), "--out", str(out), "--tool", "python")
    assert r.returncode == 2 and "--tool needs --tokenizer" in r.stderr


def test_tool_engine_close_ends_its_tool_threads(policy, tok, data):
    before = set(threading.enumerate())
    eng = _engine(policy, tok)
    [[s]] = eng.generate(_requests(tok, data[:1]))
    assert s.tool_calls == 2
    mine = [t for t in set(threading.enumerate()) - before if t.name.startswith("vt-tool")]
    assert mine and all(t.is_alive() for t in mine)  # the runner's threads, which ran the calls
    eng.close()
    assert not any(t.is_alive() for t in mine)


def test_tool_output_never_stops_a_sample_but_the_policy_turn_after_it_does(greedy, policy, tok, data):
    [[full], _, _] = greedy[0]
    _, turns, outputs = data[0]
    # the first call's output, printed by the tool (its turn): not the policy's text, so no stop
    eng = _engine(policy, tok, stop_strings=(outputs[0],))
    [[s]] = eng.generate(_requests(tok, data[:1]))
    assert outputs[0] not in "".join(turns)  # the policy never writes it itself
    assert (s.finish_reason, s.completion_ids, s.tool_calls) == ("stop", full.completion_ids, 2)
    # a stop string the policy writes after the tool turns: cut there, the text up to it
    eng = _engine(policy, tok, stop_strings=("The answer",))
    [[s]] = eng.generate(_requests(tok, data[:1]))
    # the reference: the whole completion searched (the string is in no earlier turn of it)
    m, text = find_stop_string(full.completion_ids, lambda ids: tok.decode(ids, skip_special_tokens=True),
                               ("The answer",))
    assert m > len(full.completion_ids) - len(tok.encode(turns[-1]))  # in the last turn, after both tool turns
    assert (s.finish_reason, s.completion_ids, s.text, s.tool_calls) == ("stop", full.completion_ids[:m], text, 2)
