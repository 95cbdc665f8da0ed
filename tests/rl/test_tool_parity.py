"""Sampler vs learner log-probs on multi-turn samples (issue 52): a sample that called a tool was decoded in
pieces (its turn parked at `</tool_call>`, the tool turn prefilled into its kept KV pages, decoding resumed); the
learner scores it as one row. On the policy's tokens the two log-probs agree within the sampler's tolerance
(tests/sampling/test_engine.py: 1e-4), in every row layout; the tool's tokens are not the policy's to score.

The model: the tools demo's SFT-1 (`vt demo --variant tools`, vt.data.tasks.tool_record), which calls the `python`
tool in about half of its samples (right or wrong does not matter here)."""

import numpy as np
import pytest

from testutil import tool_demo_sft1
from vt.rl.rollouts import Scored, batch_length, build_rows, policy_tokens

TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def sft_model():
    """(checkpoint, tokenizer) of the demo's tool-calling SFT-1 model, built once a session (testutil.tool_demo_sft1,
    shared with test_tool_learning.py and the tools demo's test)."""
    root = tool_demo_sft1()
    return (root / "final").resolve(), root / "data" / "tokenizer"


def test_tool_sample_logprobs_match_the_learner(sft_model):
    import jax
    from vt.checkpoint.params import flat_params, load_model
    from vt.data.sources import record_from_dict
    from vt.data.tasks import task_records
    from vt.data.tokenizer import load_tokenizer
    from vt.rl.step import make_token_logps
    from vt.sampling.config import Request, SamplerConfig, ToolsConfig
    from vt.sampling.engine import Engine
    from vt.sharding import MeshConfig, make_mesh
    from vt.train.state import ModelDef

    ckpt, tok_dir = sft_model
    tok = load_tokenizer(tok_dir)
    model = load_model(str(ckpt))
    cfg = SamplerConfig(batch_size=16, max_new_tokens=64, steps_per_call=16, temperature=TEMPERATURE,
                        tools=ToolsConfig(max_turns=2, workers=4))
    engine = Engine(model, cfg, tokenizer=tok)
    records = [record_from_dict(r, where=str(i), default_id=str(i))
               for i, r in enumerate(task_records("tools", 8, 0, split="eval", with_answer=False))]
    prompts = [tok.encode_chat(list(r.prompt), add_generation_prompt=True) for r in records]
    samples = engine.generate([Request(prompt_ids=p, n=4) for p in prompts], seed=0)
    multi = sum(x.policy_mask is not None and not x.policy_mask.all() for g in samples for x in g)
    assert multi >= 4, f"only {multi} of 32 samples called a tool"
    shape = (len(prompts), 4)
    s = Scored(prompts, samples, correct=np.zeros(shape, bool), rewards=np.zeros(shape, np.float32),
               valid=np.ones(shape, bool), lengths=np.array([[policy_tokens(x) for x in g] for g in samples]),
               truncated=np.zeros(shape, bool), domains=["math"] * len(prompts))

    mesh = make_mesh(MeshConfig())
    md = ModelDef(model.cfg)
    params = flat_params(model)
    T = batch_length(s, md.cfg.max_position_embeddings)
    worst = {}
    for share in (False, True):
        md_rows = ModelDef(md.cfg.replace(segment_branches=True)) if share else md
        logps = make_token_logps(md_rows, md.param_shardings(mesh), mesh, TEMPERATURE)
        rows = build_rows(s, T, pack=True, share=share)
        got = np.asarray(jax.device_get(logps(params, {k: rows[k] for k in
                                                       ("input_ids", "targets", "positions", "segment_ids")})))
        trained = rows["loss_mask"] > 0
        assert trained.sum() == s.lengths.sum()
        worst[share] = float(np.abs(got[trained] - rows["sampler_logp"][trained]).max())
    print(f"sampler vs learner log-probs on {int(s.lengths.sum())} policy tokens of {multi} multi-turn samples: "
          f"max |diff| {worst}")
    assert max(worst.values()) <= 1e-4, worst


def test_tool_eval_grades_final_answers_and_counts_calls(sft_model, tmp_path):
    """`vt eval` with the sampler's tools: pass@k over the final answers (the text after the last tool turn:
    never a tool's output), and the share of samples that called a tool without an error turn."""
    import json
    from vt.config import to_dataclass
    from vt.data.tasks import task_records
    from vt.eval.runner import EvalConfig, run_eval
    from vt.io import write_jsonl
    ckpt, tok_dir = sft_model
    write_jsonl(tmp_path / "heldout.jsonl", task_records("tools", 8, 0, split="eval", with_answer=False))
    cfg = to_dataclass(EvalConfig, {
        "name": "tools", "data": str(tmp_path / "heldout.jsonl"), "domain": "math", "ks": (1, 4), "maj_ks": (4,),
        "chunk_problems": 8, "progress": False,
        "model": {"ckpt": str(ckpt), "tokenizer": str(tok_dir), "dtype": "float32"},
        "sampling": {"n": 4, "max_new_tokens": 64, "batch_size": 32, "steps_per_call": 16,
                     "tools": {"max_turns": 2, "workers": 4}}})
    summary = run_eval(cfg, tmp_path / "out")
    rows = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    samples = [s for r in rows for s in r["samples"]]
    assert len(samples) == 32 and "pass@4" in summary
    calls = np.array([s["tool_calls"] for s in samples])
    ok = (calls > 0) & (np.array([s["tool_errors"] for s in samples]) == 0)
    assert calls.sum() >= 4, "the SFT model should call the tool in some samples"
    assert summary["tool_call_share"] == ok.mean() and summary["tool_calls_mean"] == calls.mean()
    assert not any("tool_response" in s["text"] or "tool_call>" in s["text"] for s, c in zip(samples, calls) if c)
