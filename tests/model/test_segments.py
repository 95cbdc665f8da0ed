"""Branch segments (vt.model.segments): a completion laid out as a branch of a shared prompt sees exactly what it
sees in a row of its own, in every attention implementation without a cache that supports branches (xla dense,
xla blocked, jax), forward and backward.

Tolerance: float32 max-abs 1e-5 (tests/model/test_parity.py's), outputs and gradients.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vt.model.attention as attention
from vt.model.segments import BRANCH, visible

FP32_TOL = 1e-5
N, K, H = 6, 2, 16


def test_visible_is_equality_for_plain_segments_and_prefix_for_branches():
    seg = np.array([0, 1, 2, 3, 2 + BRANCH, 2 + 2 * BRANCH, 3 + BRANCH])
    got = np.asarray(visible(seg[:, None], seg[None, :]))
    want = seg[:, None] == seg[None, :]
    want[4, 2] = want[5, 2] = want[6, 3] = True  # branches see their prefix document, never its other branches
    np.testing.assert_array_equal(got, want)


def _row(prefix, branches, rng):
    """One packed row: [a plain document, prefix, branch 1, ..., padding] with their q/k/v, segment ids and, for
    each branch, the row it would have alone ([prefix, branch]) and where its slots are in each."""
    T = 160
    lens = [7, prefix, *branches]
    seg = np.zeros(T, np.int32)
    at, starts = 0, []
    for d, n in enumerate(lens):
        starts.append(at)
        seg[at:at + n] = 1 if d == 0 else 2 if d == 1 else 2 + (d - 1) * BRANCH
        at += n
    q, k, v = (rng.normal(size=(T, h, H)).astype(np.float32) for h in (N, K, K))
    alone = []
    for j, n in enumerate(branches):
        idx = np.r_[starts[1]:starts[1] + prefix, starts[2 + j]:starts[2 + j] + n]
        alone.append(idx)
    return q, k, v, seg, alone


@pytest.mark.parametrize("impl", ["xla", "jax"])
@pytest.mark.parametrize("block", [16, 10 ** 6])  # blocked (several blocks per row) and dense
def test_a_branch_sees_its_prefix_and_itself_as_alone(impl, block, monkeypatch):
    monkeypatch.setattr(attention, "ATTENTION_BLOCK", block)
    rng = np.random.default_rng(0)
    q, k, v, seg, alone = _row(prefix=23, branches=[19, 40, 1, 31], rng=rng)
    w = rng.normal(size=q.shape).astype(np.float32)

    def run(q, k, v, seg):
        f = lambda q, k, v: attention.self_attention(q[None], k[None], v[None], jnp.asarray(seg)[None], impl,
                                                     branches=True)[0]
        out, vjp = jax.vjp(f, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
        return np.asarray(out), [np.asarray(g) for g in vjp(jnp.asarray(w[:len(q)]))]

    out, (dq, dk, dv) = run(q, k, v, seg)
    dk_prefix = np.zeros_like(dk)
    for idx in alone:  # the branch in a row of its own: positions of the prefix, then the branch
        w_alone = w[idx]
        f = lambda q_, k_, v_: attention.self_attention(q_[None], k_[None], v_[None],
                                                        jnp.ones((1, len(idx)), jnp.int32), impl)[0]
        o, vjp = jax.vjp(f, jnp.asarray(q[idx]), jnp.asarray(k[idx]), jnp.asarray(v[idx]))
        branch = idx[idx >= idx[0] + 23]
        n = len(branch)
        np.testing.assert_allclose(out[branch], np.asarray(o)[-n:], atol=FP32_TOL, rtol=0)
        # the branch's own slots: gradients only from the branch itself (and its loss weights)
        mask = np.zeros((len(idx), 1, 1), np.float32)
        mask[-n:] = 1
        gq, gk, gv = (np.asarray(g) for g in jax.vjp(f, jnp.asarray(q[idx]), jnp.asarray(k[idx]),
                                                     jnp.asarray(v[idx]))[1](jnp.asarray(w_alone * mask)))
        np.testing.assert_allclose(dq[branch], gq[-n:], atol=FP32_TOL, rtol=0)
        np.testing.assert_allclose(dk[branch], gk[-n:], atol=FP32_TOL, rtol=0)
        np.testing.assert_allclose(dv[branch], gv[-n:], atol=FP32_TOL, rtol=0)
        dk_prefix[idx[:23]] += gk[:23]
    # the prefix's keys collect every branch's gradient (and the prefix's own queries')
    prefix = alone[0][:23]
    f = lambda q_, k_, v_: attention.self_attention(q_[None], k_[None], v_[None], jnp.ones((1, 23), jnp.int32),
                                                    impl)[0]
    dk_prefix[prefix] += np.asarray(jax.vjp(f, jnp.asarray(q[prefix]), jnp.asarray(k[prefix]),
                                            jnp.asarray(v[prefix]))[1](jnp.asarray(w[prefix]))[1])
    np.testing.assert_allclose(dk[prefix], dk_prefix[prefix], atol=FP32_TOL, rtol=0)
    assert out[:7].std() > 0 and np.isfinite(out).all()


def test_without_branches_a_branch_id_is_a_segment_of_its_own(monkeypatch):
    """The model's default (ModelConfig.segment_branches False, every path but the RL learner's shared rows):
    plain equality, so a branch sees only itself; splash refuses branches instead of masking them wrongly."""
    rng = np.random.default_rng(1)
    q, k, v, seg, alone = _row(prefix=23, branches=[19, 40], rng=rng)
    for block in (16, 10 ** 6):  # blocked and dense
        monkeypatch.setattr(attention, "ATTENTION_BLOCK", block)
        out = np.asarray(attention.self_attention(*(jnp.asarray(x)[None] for x in (q, k, v, seg)), "xla")[0])
        branch = alone[1][23:]  # the second branch alone, without its prefix
        ref = attention.self_attention(*(jnp.asarray(x[branch])[None] for x in (q, k, v)),
                                       jnp.ones((1, len(branch)), jnp.int32), "xla")[0]
        np.testing.assert_allclose(out[branch], np.asarray(ref), atol=FP32_TOL, rtol=0)
    assert not attention.supports_branches("splash")
    assert all(attention.supports_branches(i) for i in ("xla", "jax", "cudnn"))
    with pytest.raises(Exception, match="cannot mask branch segments"):
        attention.self_attention(*(jnp.asarray(x)[None] for x in (q, k, v, seg)), "splash", branches=True)
