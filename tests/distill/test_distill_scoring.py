"""S_LP equals a direct forward pass; the LP band filter against hand-computed cases; stage 4 end to end."""
import json

import numpy as np
import pytest

from eval_helpers import AIME, StandIn, aime_rows, math_reward  # noqa: F401 (session fixtures)
from vt import VtError
from vt.distill.scoring import Scorer, ScoringConfig
from vt.distill.selection import DomainRule, ScoredTrace, band_select, select


@pytest.fixture(scope="module")
def tiny_model():
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    return create_model(preset("tiny", max_position_embeddings=1024), seed=3)


def direct_nll(model, prompt, completion):
    """-(1/|y|) sum_t log pi(y_t | q, y_<t) from one unpadded forward pass, log-softmax in numpy."""
    import jax
    from flax import nnx
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x)[0])  # jit only to skip eager dispatch
    logits = np.asarray(forward(state, np.array(prompt + completion)[None])[0], np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        logits.max(-1, keepdims=True)
    P = len(prompt)
    return -np.mean([logp[P - 1 + t, completion[t]] for t in range(len(completion))])


@pytest.mark.parametrize("cfg", [ScoringConfig(batch_size=3, min_bucket=8),
                                 ScoringConfig(batch_size=2, chunk_tokens=16, min_bucket=8)],
                         ids=["full", "kv_chunks"])
def test_scorer_matches_direct_forward(tiny_model, cfg):
    rng = np.random.default_rng(0)
    lens = [(5, 3), (1, 40), (17, 1), (30, 25), (2, 2)]
    prompts = [rng.integers(0, 512, p).tolist() for p, _ in lens]
    comps = [rng.integers(0, 512, c).tolist() for _, c in lens]
    got = Scorer(tiny_model, cfg).nll(prompts, comps)
    want = [direct_nll(tiny_model, p, c) for p, c in zip(prompts, comps)]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_scorer_rejects_empty(tiny_model):
    with pytest.raises(VtError, match="empty completion"):
        Scorer(tiny_model).nll([[1, 2]], [[]])


@pytest.mark.devices(4)
def test_scorer_sharded_matches_unsharded():
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.sharding import MeshConfig, make_mesh
    cfg = preset("tiny", max_position_embeddings=128)
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=2))
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 512, int(n)).tolist() for n in (3, 9, 4, 20)]
    comps = [rng.integers(0, 512, int(n)).tolist() for n in (7, 2, 30, 5)]
    sharded = ScoringConfig(batch_size=4, chunk_tokens=16, min_bucket=8)
    a = Scorer(create_model(cfg, mesh, seed=0), sharded, mesh).nll(prompts, comps)
    b = Scorer(create_model(cfg, None, seed=0), ScoringConfig(batch_size=3, min_bucket=8)).nll(prompts, comps)
    assert float(np.max(np.abs(a - b))) < 1e-4


def T(i, length, score, domain="math"):
    return ScoredTrace(f"t{i}", domain, length, score)


def test_band_select_hand_computed():
    # 10 traces in one bucket, scores 0.0 .. 0.9; band [0.3, 0.9): ranks 3..8 kept, 0-2 low, 9 outlier.
    traces = [T(i, 100, i / 10) for i in range(10)] + [T(99, 5, 0.45)]
    kept, dropped = band_select(traces, DomainRule(min_tokens=10, band_lo=0.3, band_hi=0.9))
    assert [t.id for t in kept] == [f"t{i}" for i in range(3, 9)]
    assert dropped == {"too_short": ["t99"], "low_score": ["t0", "t1", "t2"], "high_outlier": ["t9"]}


def test_band_select_ranks_within_length_buckets():
    # short bucket (< 50): scores 1..4; long bucket: scores 5..8. Band [0.5, 0.75) of N = 4 keeps rank 2 in each.
    traces = [T(i, 10 + i, float(i + 1)) for i in range(4)] + [T(10 + i, 60 + i, float(i + 5)) for i in range(4)]
    kept, dropped = band_select(traces, DomainRule(length_edges=(50,), band_lo=0.5, band_hi=0.75))
    assert sorted(t.id for t in kept) == ["t12", "t2"]  # a global ranking would keep t12 and t13 instead
    assert sorted(dropped["high_outlier"]) == ["t13", "t3"]


def test_select_mixes_domains_by_weight():
    traces = [T(i, 100, i, "math") for i in range(10)] + [T(100 + i, 100, i, "code") for i in range(10)]
    rules = {"math": DomainRule(band_lo=0.0, band_hi=1.0, weight=3.0),
             "code": DomainRule(band_lo=0.0, band_hi=0.5, weight=1.0)}
    chosen, report = select(traces, rules, total=12, seed=0)
    assert report["domains"]["math"]["selected"] == 9 and report["domains"]["code"]["selected"] == 3
    chosen2, _ = select(traces, {**rules, "math": DomainRule(band_lo=0.0, band_hi=0.5, weight=3.0)}, total=12)
    assert len(chosen2) == 8  # math wanted 9 of 5 in band: gives its 5, short by 4
    with pytest.raises(VtError, match="no rule"):
        select(traces, {"math": rules["math"]})


def test_self_distill_end_to_end(tmp_path, aime_rows, math_reward, tiny_model):
    """Stand-in RL checkpoint on AIME -> verified traces only -> S_LP by the tiny student -> band selection."""
    from vt.data.tokenizer import build_tiny_tokenizer
    from vt.distill.run import Rules, Selection, SelfDistillConfig, Source, Sources, run_self_distill
    from vt.sampling.config import SamplerConfig
    tok = build_tiny_tokenizer(tmp_path / "tok")
    cfg = SelfDistillConfig(sources=Sources(math=Source(data=str(AIME), n=4, limit=8)),
                            sampling=SamplerConfig(n=4), progress=False,
                            selection=Selection(rules=Rules(math=DomainRule(band_lo=0.25, band_hi=0.75))))
    report = run_self_distill(cfg, tmp_path / "w", generators={"math": StandIn(aime_rows)},
                              rewards={"math": math_reward}, student=tiny_model, tokenizer=tok)
    # PATTERNS over 8 problems hold 4+1+2+0+2+1+0+2 = 12 correct samples; band [3, 9) of 12
    assert report["verified_traces"] == 12 and report["selected"] == 6
    rows = [json.loads(x) for x in (tmp_path / "w" / "selected.jsonl").read_text().splitlines()]
    scores = {json.loads(x)["id"]: json.loads(x) for x in (tmp_path / "w" / "scores.jsonl").read_text().splitlines()}
    assert len(rows) == 6 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    ranked = sorted(scores.values(), key=lambda r: (r["s_lp"], r["id"]))
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in ranked[3:9])
    # the stored S_LP is the student's NLL of that trace
    r = rows[0]
    p = tok.encode_chat(r["messages"][:-1], add_generation_prompt=True)
    c = tok.encode(r["messages"][-1]["content"]) + [tok.token_to_id("<|im_end|>")]
    assert r["metadata"]["s_lp"] == pytest.approx(direct_nll(tiny_model, p, c), rel=1e-4)


def test_self_distill_config_loads():
    from pathlib import Path

    from vt.config import load_config, to_dataclass
    from vt.distill.run import SelfDistillConfig
    path = Path(__file__).resolve().parents[2] / "configs" / "self_distill.py"
    for variant in ("", ":smoke"):
        cfg = to_dataclass(SelfDistillConfig, load_config(f"{path}{variant}"))
        assert cfg.selection.rules.math.length_edges == (4096, 8192, 16384)
