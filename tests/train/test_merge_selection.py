"""Diversity-Exploring Distillation: pass@k, choosing per domain over real sampled outputs, merging, `vt merge`."""
import itertools
import math

import jax
import numpy as np
import pytest

from testutil import run_vt
from vt import VtError
from vt.train.merge import merge_params, normalize_weights
from vt.train.selection import best_per_domain, mean_pass_at_k, pass_at_k, select_and_merge


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in range(1, 8) for c in range(n + 1) for k in range(1, n + 1)])
def test_pass_at_k_is_the_probability_over_k_subsets(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(64, 0, 8) == 0.0 and pass_at_k(64, 64, 8) == 1.0 and pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(1000, 1, 1000) == 1.0
    with pytest.raises(VtError):
        pass_at_k(4, 5, 1)
    with pytest.raises(VtError):
        pass_at_k(4, 1, 5)


def test_merge_params_uniform_and_weighted():
    a = {"w": np.full((2, 3), 1.0, np.float32), "b": np.zeros(3, np.float32)}
    b = {"w": np.full((2, 3), 3.0, np.float32), "b": np.ones(3, np.float32)}
    np.testing.assert_allclose(merge_params([a, b])["w"], 2.0)
    out = merge_params([a, b], [1, 3])
    np.testing.assert_allclose(out["w"], 2.5) and np.testing.assert_allclose(out["b"], 0.75)
    assert out["w"].dtype == np.float32
    with pytest.raises(VtError, match="weights"):
        normalize_weights([1, -1], 2)
    with pytest.raises(VtError, match="different parameters"):
        merge_params([a, {"w": a["w"]}])


@pytest.fixture(scope="module")
def three_ckpts(tmp_path_factory):
    from vt.checkpoint.params import save_model
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    root = tmp_path_factory.mktemp("ckpts")
    return [save_model(root / f"c{s}", create_model(preset("tiny"), seed=s)) for s in range(3)]


def test_vt_merge_command(three_ckpts, tmp_path):
    from vt.checkpoint.params import flat_params, load_model
    a, b, _ = three_ckpts
    proc = run_vt("merge", "--out", str(tmp_path / "m"), str(a), str(b), "--weights", "1,3")
    assert proc.returncode == 0, proc.stderr
    pa, pb, pm = (flat_params(load_model(d)) for d in (a, b, tmp_path / "m"))
    for k in pa:
        np.testing.assert_allclose(np.asarray(pm[k]), 0.25 * np.asarray(pa[k]) + 0.75 * np.asarray(pb[k]),
                                   rtol=1e-6, atol=1e-7, err_msg=k)
    bad = run_vt("merge", "--out", str(tmp_path / "m2"), str(a), str(b), "--weights", "1")
    assert bad.returncode == 2 and "2 checkpoints" in bad.stderr


def test_distillation_picks_per_domain_over_real_samples(three_ckpts, tmp_path):
    """Real samples from vt.sampling's engine, a stand-in verifier (answer = first token's parity, which
    random-init models get right at different rates per domain), then choice and merge."""
    from vt.checkpoint.params import flat_params, load_model
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    rng = np.random.default_rng(0)
    n, k = 8, 2
    prompts = {d: [[int(t) for t in rng.integers(4, 100, 6)] for _ in range(4)] for d in ("math", "code")}
    sampler = SamplerConfig(batch_size=16, max_new_tokens=2, temperature=1.0, seed=0)

    def scorer(ckpt):
        engine = Engine(load_model(ckpt), sampler)
        scores = {}
        for d, ps in prompts.items():
            out = engine.generate([Request(prompt_ids=p, n=n) for p in ps])
            correct = np.array([[s.completion_ids[0] % 2 == int(d == "code") for s in row] for row in out])
            scores[d] = mean_pass_at_k(np.ones_like(correct), correct, k)
        return scores

    report = select_and_merge(three_ckpts, scorer, tmp_path / "merged")
    scores = report["scores"]
    assert set(report["chosen"]) == {"math", "code"}
    for domain, ckpt in report["chosen"].items():
        assert scores[ckpt][domain] == max(s[domain] for s in scores.values())
    assert sum(report["weights"].values()) == pytest.approx(1.0)
    merged = flat_params(load_model(tmp_path / "merged"))
    parts = {c: flat_params(load_model(c)) for c in report["weights"]}
    key = "layers.mlp.up_kernel"
    want = sum(w * np.asarray(parts[c][key]) for c, w in report["weights"].items())
    np.testing.assert_allclose(np.asarray(merged[key]), want, rtol=1e-6, atol=1e-7)
    print("pass@2 per checkpoint:", {c.split("/")[-1]: s for c, s in scores.items()}, "chosen:", report["chosen"])


def test_best_per_domain_ties_prefer_the_later_checkpoint():
    from pathlib import Path
    s = {Path("a"): {"math": 0.5, "code": 0.9}, Path("b"): {"math": 0.5, "code": 0.1}}
    assert best_per_domain(s) == {"math": Path("b"), "code": Path("a")}
