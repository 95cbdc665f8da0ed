"""Sampling rules against an independent numpy reference: frequencies (chi-square) and log-probs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from vt import VtError
from vt.sampling.rules import SamplingParams, sample, sampling_logprobs

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.7, 1.2, -2.0], np.float32)


def reference_q(logits, temperature, top_k, top_p):
    """The sampling distribution, written out the slow way: temperature, keep the k best (ties: lower id),
    renormalise, keep the shortest descending prefix reaching mass p, renormalise."""
    x = logits.astype(np.float64) / temperature
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    kept = order[:top_k] if top_k > 0 else order
    probs = np.exp(x[kept] - x[kept].max())
    probs /= probs.sum()
    final, mass = [], 0.0
    for i, pr in zip(kept, probs):
        if mass < top_p:
            final.append(i)
        mass += pr
    q = np.zeros(len(x))
    w = np.exp(x[final] - x[final].max())
    q[final] = w / w.sum()
    return q


CASES = [(1.0, -1, 1.0), (0.5, -1, 1.0), (1.7, -1, 1.0), (1.0, 3, 1.0), (1.0, -1, 0.6), (0.7, 5, 0.8),
         (1.3, 4, 0.95), (1.0, 1, 1.0), (2.0, -1, 0.3)]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_frequencies_and_logprobs_match_the_distribution(temperature, top_k, top_p):
    params = SamplingParams(temperature, top_p, top_k)
    q = reference_q(LOGITS, temperature, top_k, top_p)
    N = 20000
    keys = jax.random.split(jax.random.PRNGKey(0), N)
    tokens, logprobs = jax.jit(sample, static_argnums=2)(keys, jnp.broadcast_to(LOGITS, (N, len(LOGITS))), params)
    tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
    counts = np.bincount(tokens, minlength=len(LOGITS))
    assert counts[q == 0].sum() == 0, "sampled a token outside the candidate set"
    kept = q > 0
    if kept.sum() > 1:
        _, p_value = chisquare(counts[kept], q[kept] * N)
        assert p_value > 1e-3, (counts, q * N)
    np.testing.assert_allclose(logprobs, np.log(q[tokens]), atol=1e-5)
    full = np.asarray(sampling_logprobs(jnp.asarray(LOGITS)[None], params))[0]
    np.testing.assert_allclose(np.exp(full), q, atol=1e-6)


def test_greedy_is_argmax_with_logprob_zero():
    logits = jnp.asarray(np.random.RandomState(0).randn(5, 37), jnp.float32)
    tokens, logprobs = sample(jax.random.split(jax.random.PRNGKey(0), 5), logits, SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(tokens, np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(logprobs, 0.0)


def test_rows_depend_only_on_their_own_key():
    logits = jnp.asarray(np.random.RandomState(1).randn(8, 50), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 8)
    params = SamplingParams(1.0, 0.9, 20)
    full, _ = sample(keys, logits, params)
    half, _ = sample(keys[2:5], logits[2:5], params)
    np.testing.assert_array_equal(full[2:5], half)
    again, _ = sample(keys, logits, params)
    np.testing.assert_array_equal(full, again)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=0),
                                    dict(top_k=-2)])
def test_invalid_params_are_errors(kwargs):
    with pytest.raises(VtError):
        SamplingParams(**kwargs)
