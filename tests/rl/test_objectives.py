"""MGPO's pure functions against hand-computed values (RECIPE.md, stage 3)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vt.rl.objectives import (clipped_surrogate, group_accuracy, group_advantages, kl_to_reference,
                              max_entropy_deviation, mgpo_advantages, mgpo_weight, truncated_importance_weight)


def test_d_me_at_known_points():
    d = np.asarray(max_entropy_deviation(jnp.array([0.0, 0.5, 1.0, 0.25])))
    assert d[0] == pytest.approx(math.log(2), abs=1e-7)
    assert d[1] == pytest.approx(0.0, abs=1e-7)
    assert d[2] == pytest.approx(math.log(2), abs=1e-7)
    p = 0.25
    assert d[3] == pytest.approx(p * math.log(p / 0.5) + (1 - p) * math.log((1 - p) / 0.5), abs=1e-6)
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert d[3] == pytest.approx(math.log(2) - h, abs=1e-6)
    assert np.all(np.isfinite(d))


def test_weight_values():
    w = np.asarray(mgpo_weight(jnp.array([0.0, 0.5, 1.0, 0.75]), gamma=2.0))
    assert w[1] == pytest.approx(1.0)
    assert w[0] == pytest.approx(math.exp(-2 * math.log(2)))  # = 0.25
    assert w[0] == pytest.approx(w[2])
    assert w[1] > w[3] > w[0]


def test_gamma_zero_is_grpo():
    rng = np.random.RandomState(0)
    correct = rng.rand(5, 8) < 0.4
    rewards = correct.astype(np.float32)
    adv, w = mgpo_advantages(rewards, correct, gamma=0.0)
    np.testing.assert_array_equal(np.asarray(w), 1.0)
    np.testing.assert_array_equal(np.asarray(adv), np.asarray(group_advantages(rewards)))


def test_advantages_hand_computed_and_zero_variance():
    r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    a = np.asarray(group_advantages(r, eps=0.0 + 1e-6))
    std = np.std([1, 0, 0, 1], ddof=1)
    np.testing.assert_allclose(a[0], (np.array([1, 0, 0, 1]) - 0.5) / (std + 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(a[1:], 0.0)  # zero variance: zero advantage, no NaN
    assert np.all(np.isfinite(a))
    assert float(group_accuracy(r)[0]) == 0.5


def test_surrogate_gradient_matches_finite_differences():
    rng = np.random.RandomState(1)
    N, T = 4, 6
    old = jnp.asarray(rng.randn(N, T) * 0.3 - 1.0)
    mask = jnp.asarray(np.arange(T)[None] < np.array([6, 3, 5, 1])[:, None])
    adv = jnp.asarray(rng.randn(N))
    is_w = truncated_importance_weight(old, old + 0.05 * rng.randn(N, T), cap=2.0)
    for agg in ("seq_mean", "token_mean"):
        f = lambda lp: clipped_surrogate(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, aggregation=agg,  # noqa
                                         is_weight_YT=is_w)[0]
        x = old + 0.1 * jnp.asarray(rng.randn(N, T))  # ratios near, some beyond, the clip range
        x = jnp.asarray(x, jnp.float64) if jax.config.jax_enable_x64 else x
        g = np.asarray(jax.grad(f)(x))
        h = 1e-3
        for i, t in [(0, 0), (1, 2), (2, 4), (3, 0), (1, 5)]:
            e = np.zeros((N, T), np.float32)
            e[i, t] = h
            fd = (float(f(x + e)) - float(f(x - e))) / (2 * h)
            assert g[i, t] == pytest.approx(fd, abs=2e-3), (agg, i, t)
        assert np.all(g[~np.asarray(mask)] == 0)  # padding carries no gradient


def test_surrogate_aggregations_hand_computed():
    lp = jnp.zeros((2, 3))
    mask = jnp.array([[1, 1, 1], [1, 0, 0]])
    adv = jnp.array([1.0, -2.0])
    # ratio 1 everywhere: per-token value = A
    J_seq, _ = clipped_surrogate(lp, lp, adv, mask, eps_low=0.2, eps_high=0.2, aggregation="seq_mean")
    J_tok, _ = clipped_surrogate(lp, lp, adv, mask, eps_low=0.2, eps_high=0.2, aggregation="token_mean")
    assert float(J_seq) == pytest.approx((1.0 + -2.0) / 2)
    assert float(J_tok) == pytest.approx((3 * 1.0 - 2.0) / 4)


def test_clipping_uses_separate_bounds():
    old = jnp.zeros((2, 1))
    new = jnp.log(jnp.array([[1.5], [0.5]]))
    adv = jnp.array([1.0, -1.0])
    J, m = clipped_surrogate(new, old, adv, jnp.ones((2, 1)), eps_low=0.2, eps_high=0.3,
                             aggregation="token_mean")
    # row 0: min(1.5, 1.3) * 1 = 1.3 ; row 1: min(0.5 * -1, 0.8 * -1) = -0.8
    assert float(J) == pytest.approx((1.3 - 0.8) / 2, abs=1e-6)
    assert float(m["clip_fraction"]) == pytest.approx(1.0)


def test_truncated_importance_weight():
    learner = jnp.log(jnp.array([0.5, 0.9, 0.1]))
    sampler = jnp.log(jnp.array([0.5, 0.3, 0.2]))
    w = np.asarray(truncated_importance_weight(learner, sampler, cap=2.0))
    np.testing.assert_allclose(w, [1.0, 2.0, 0.5], rtol=1e-6)  # 0.9/0.3 = 3 capped at 2
    assert float(jax.grad(lambda x: truncated_importance_weight(x, sampler, 2.0).sum())(learner).sum()) == 0.0


def test_kl_k3_nonnegative_and_zero_at_equality():
    rng = np.random.RandomState(2)
    a, b = jnp.asarray(rng.randn(10)), jnp.asarray(rng.randn(10))
    assert np.all(np.asarray(kl_to_reference(a, b)) >= 0)
    np.testing.assert_allclose(np.asarray(kl_to_reference(a, a)), 0.0, atol=1e-7)


def test_verifier_errors_are_left_out_not_zeroed():
    r = np.array([[1.0, 0.0, 0.0, 1.0, 0.0]])
    valid = np.array([[True, True, True, True, False]])
    a = np.asarray(group_advantages(r, valid_EC=valid))
    np.testing.assert_allclose(a[0, :4], np.asarray(group_advantages(r[:, :4]))[0], rtol=1e-6)
    assert a[0, 4] == 0.0
    assert float(group_accuracy(r, valid)[0]) == 0.5  # not 0.4: the unknown one is not counted as wrong
