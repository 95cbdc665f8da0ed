"""Helpers for the learner tests (not a conftest.py: tests/conftest.py is imported as `conftest`)."""
from __future__ import annotations

import numpy as np


def random_batch(rng: np.random.Generator, A: int, B: int, T: int, vocab: int = 512) -> dict[str, np.ndarray]:
    """Packed rows of random documents (2-3 per row) with assistant-like masks and trailing padding."""
    out = {k: np.zeros((A, B, T), np.int32) for k in ("input_ids", "targets", "segment_ids", "positions")}
    out["loss_mask"] = np.zeros((A, B, T), np.float32)
    for a in range(A):
        for b in range(B):
            t = 0
            for seg in range(1, 4):
                L = int(rng.integers(3, T // 3))
                if t + L > T - 2:
                    break
                toks = rng.integers(4, vocab, L + 1)
                out["input_ids"][a, b, t:t + L] = toks[:-1]
                out["targets"][a, b, t:t + L] = toks[1:]
                out["segment_ids"][a, b, t:t + L] = seg
                out["positions"][a, b, t:t + L] = np.arange(L)
                out["loss_mask"][a, b, t + L // 2:t + L - 1] = 1.0
                t += L
    return out


# --- chunked log-probs vs the full-logits reference (test_chunked_loss.py, also run on the 8-device mesh) ---------

def reference_logps(md, params, b, temperature):
    """log pi(target) and entropy per position from the full float32 logits [B, T, V] of ModelDef.apply."""
    import jax
    import jax.numpy as jnp
    logits = md.apply(params, b["input_ids"], b["positions"], b["segment_ids"])
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, b["targets"][..., None], -1)[..., 0]
    return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, -1)


def chunked_logps(md, params, b, temperature, chunk):
    return md.token_logps(params, b["input_ids"], b["positions"], b["segment_ids"], b["targets"],
                          temperature=temperature, chunk=chunk, with_entropy=True)


def value_and_grad_of(logps_fn):
    """jit((params, batch) -> ((masked mean NLL, (logp, entropy)), grads)) for a log-prob function."""
    import jax
    from vt.train.losses import masked_nll_sum

    def loss(params, b):
        logp, ent = logps_fn(params, b)
        total, count = masked_nll_sum(logp, b["loss_mask"])
        return total / count, (logp, ent)
    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def assert_logps_equal(ref, got):
    """fp32: loss within 1e-6 relative; log-probs, entropy and every gradient within 1e-5 absolute."""
    (l0, (lp0, e0)), g0 = ref
    (l1, (lp1, e1)), g1 = got
    assert abs(float(l1) - float(l0)) <= 1e-6 * abs(float(l0)), (float(l0), float(l1))
    np.testing.assert_allclose(np.asarray(lp1), np.asarray(lp0), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(e1), np.asarray(e0), rtol=0, atol=1e-5)
    assert set(g0) == set(g1)
    for k in g0:
        np.testing.assert_allclose(np.asarray(g1[k]), np.asarray(g0[k]), rtol=0, atol=1e-5, err_msg=k)
