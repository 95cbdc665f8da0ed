"""Long2Short shaping: the RECIPE formula and its properties, checked with hypothesis."""
from __future__ import annotations

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vt.rewards.shaping import LAMBDA, long2short

# Compiled once per group size: hypothesis tries many sizes, and eager dispatch per op is slow.
shaped = jax.jit(long2short)

groups = st.integers(1, 16).flatmap(
    lambda g: st.tuples(
        st.lists(st.sampled_from([0.0, 1.0]), min_size=g, max_size=g),
        st.lists(st.integers(1, 65536), min_size=g, max_size=g),
    )
)


def reference(r, L, lam=LAMBDA):
    """The formula, written out with Python floats."""
    C = [i for i, x in enumerate(r) if x == 1]
    out = list(map(float, r))
    if len(C) <= 1 or len({L[i] for i in C}) == 1:
        return out
    s = {i: 1.0 / L[i] for i in C}
    s_bar = sum(s.values()) / len(C)
    m = max(abs(s[i] - s_bar) for i in C)
    for i in C:
        out[i] = r[i] + lam * (s[i] - s_bar) / m
    return out


def test_worked_example():
    # s = [0.1, 0.05, -, 0.025], s_bar = 0.175 / 3, max |s - s_bar| = 0.1 - s_bar
    out = np.asarray(long2short([1, 1, 0, 1], [10, 20, 5, 40]))
    np.testing.assert_allclose(out, [1.2, 0.96, 0.0, 0.84], atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(groups)
def test_matches_formula_zero_sum_and_leaves_incorrect_alone(group):
    r, L = group
    out = np.asarray(shaped(np.array(r), np.array(L)), np.float64)
    np.testing.assert_allclose(out, reference(r, L), atol=1e-5)
    correct = np.array(r) == 1
    assert np.array_equal(out[~correct], np.array(r)[~correct])  # incorrect rewards untouched, exactly
    assert abs(np.sum(out[correct] - 1.0)) < 1e-4  # shifts sum to zero over C
    assert np.all(np.abs(out[correct] - 1.0) <= LAMBDA + 1e-6)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 16), st.integers(1, 100_000), st.lists(st.sampled_from([0.0, 1.0]), min_size=16, max_size=16))
def test_unchanged_when_correct_lengths_are_equal(g, length, r):
    r = np.array(r[:g])
    L = np.where(r == 1, length, np.arange(1, g + 1) * 7)  # incorrect lengths differ; correct ones do not
    np.testing.assert_array_equal(np.asarray(shaped(r, L)), r)


def test_batched_over_groups_and_jittable():
    r = np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], np.float32)
    L = np.array([[10, 20, 5, 40], [1, 2, 3, 4], [7, 8, 9, 10]])
    out = np.asarray(jax.jit(long2short)(r, L))
    np.testing.assert_allclose(out[0], [1.2, 0.96, 0.0, 0.84], atol=1e-6)
    np.testing.assert_array_equal(out[1:], r[1:])  # no correct response / a single one: unchanged
