"""Pure pieces of the learner: the schedule, the loss, packing/masking invariances, global normalisation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from testutil import tiny_setup  # noqa: F401 (fixture)
from train_helpers import random_batch
from vt import VtError
from vt.train.losses import masked_nll_sum, token_logps
from vt.train.optim import OptimConfig, lr_schedule, make_optimizer, warmup_steps


def test_schedule_warmup_end_decay_end_and_floor():
    cfg = OptimConfig(lr=5e-5, final_lr=8e-8, warmup_frac=0.05)
    total = 200
    W = warmup_steps(cfg, total)
    assert W == 10
    lr = lr_schedule(cfg, total)
    f = lambda s: float(lr(s))
    assert f(0) == pytest.approx(5e-5 / W)
    assert f(W - 1) == pytest.approx(5e-5) and f(W) == pytest.approx(5e-5)  # warmup ends at the peak
    mid = W + (total - 1 - W) / 2
    assert f(mid) == pytest.approx((5e-5 + 8e-8) / 2, rel=1e-5)
    assert f(total - 1) == pytest.approx(8e-8, rel=1e-4)  # the last step runs at the floor
    assert f(total + 50) == pytest.approx(8e-8, rel=1e-4)  # and it never goes below
    values = [f(s) for s in range(W, total)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    with pytest.raises(VtError, match="final_lr"):
        lr_schedule(OptimConfig(lr=1e-5, final_lr=1e-4), 10)


def test_weight_decay_skips_norms_and_biases():
    opt, _ = make_optimizer(OptimConfig(lr=1.0, weight_decay=0.5, warmup_frac=0.0, clip_norm=0.0), 10)
    params = {"w": jnp.ones((2, 2)), "norm": jnp.ones((2,))}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zeros, opt.init(params), params)
    assert float(jnp.abs(updates["w"]).max()) > 0 and float(jnp.abs(updates["norm"]).max()) == 0


def test_token_logps_match_log_softmax():
    rng = np.random.default_rng(0)
    x, head = rng.normal(size=(2, 5, 7)).astype(np.float32), rng.normal(size=(7, 11)).astype(np.float32)
    targets = rng.integers(0, 11, (2, 5))
    logits = np.einsum("btd,dv->btv", x, head)
    ref = np.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    got = token_logps(jnp.asarray(x), jnp.asarray(head), jnp.asarray(targets), vocab_size=11, dtype="float32", chunk=2)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    mask = np.zeros((2, 5), np.float32)
    bad = np.asarray(got).copy()
    bad[0, 0] = np.nan  # garbage at a masked position must not leak
    total, count = masked_nll_sum(jnp.asarray(bad), jnp.asarray(mask))
    assert float(total) == 0.0 and float(count) == 0.0


def test_packed_loss_equals_token_weighted_unpacked_loss(tiny_setup):
    cfg, mesh, md, params = tiny_setup
    rng = np.random.default_rng(1)
    lengths = [9, 13, 6, 11]
    docs = [rng.integers(4, cfg.vocab_size, L + 1) for L in lengths]
    masks = [np.r_[np.zeros(L // 3), np.ones(L - L // 3 - 1), 0.0].astype(np.float32) for L in lengths]
    T = sum(lengths) + 5
    packed = {k: np.zeros((1, T), np.int32) for k in ("input_ids", "targets", "segment_ids", "positions")}
    packed["loss_mask"] = np.zeros((1, T), np.float32)
    Tu = max(lengths)
    unpacked = {k: np.zeros((len(docs), Tu), np.int32) for k in packed}
    unpacked["loss_mask"] = np.zeros((len(docs), Tu), np.float32)
    t = 0
    for i, (d, m, L) in enumerate(zip(docs, masks, lengths)):
        for batch, row, start, seg in ((packed, 0, t, i + 1), (unpacked, i, 0, 1)):
            batch["input_ids"][row, start:start + L] = d[:-1]
            batch["targets"][row, start:start + L] = d[1:]
            batch["loss_mask"][row, start:start + L] = m
            batch["segment_ids"][row, start:start + L] = seg
            batch["positions"][row, start:start + L] = np.arange(L)
        t += L

    def loss_terms(b):
        logp = md.token_logps(params, b["input_ids"], b["positions"], b["segment_ids"], b["targets"], chunk=8)
        return masked_nll_sum(logp, b["loss_mask"])

    p_total, p_count = loss_terms(packed)
    per_doc = [loss_terms({k: v[i:i + 1] for k, v in unpacked.items()}) for i in range(len(docs))]
    u_total, u_count = sum(float(a) for a, _ in per_doc), sum(float(c) for _, c in per_doc)
    assert float(p_count) == u_count
    # token-weighted mean over documents == the packed row's mean
    assert float(p_total) / float(p_count) == pytest.approx(u_total / u_count, rel=1e-6, abs=1e-6)
    assert float(p_total) == pytest.approx(u_total, rel=1e-6)


def test_gradients_ignore_targets_of_unsupervised_tokens(tiny_setup):
    from vt.train.step import _loss_and_grads
    cfg, mesh, md, params = tiny_setup
    rng = np.random.default_rng(2)
    batch = random_batch(rng, 1, 2, 32)
    other = dict(batch)
    other["targets"] = np.where(batch["loss_mask"] > 0, batch["targets"], rng.integers(0, cfg.vocab_size, (1, 2, 32)))
    assert (other["targets"] != batch["targets"]).any()
    psh = md.param_shardings(mesh)
    f = jax.jit(lambda p, b: _loss_and_grads(md, p, b, psh))
    l1, g1, _ = f(params, batch)
    l2, g2, _ = f(params, other)
    assert float(l1) == float(l2)
    for k in g1:
        np.testing.assert_array_equal(np.asarray(g1[k]), np.asarray(g2[k]), err_msg=k)


def test_accumulation_normalises_over_the_global_batch(tiny_setup):
    """4 rows as 1 micro-batch of 4 or 4 micro-batches of 1: same loss and gradients (per-token mean over all)."""
    from vt.train.step import _loss_and_grads
    cfg, mesh, md, params = tiny_setup
    batch = random_batch(np.random.default_rng(3), 1, 4, 32)
    split = {k: v.reshape(4, 1, 32) for k, v in batch.items()}
    psh = md.param_shardings(mesh)
    f = jax.jit(lambda p, b: _loss_and_grads(md, p, b, psh))
    l1, g1, n1 = f(params, batch)
    l4, g4, n4 = f(params, split)
    assert float(n1) == float(n4) == batch["loss_mask"].sum()
    assert float(l1) == pytest.approx(float(l4), rel=1e-6)
    for k in g1:
        np.testing.assert_allclose(np.asarray(g1[k]), np.asarray(g4[k]), rtol=1e-4, atol=1e-7, err_msg=k)
