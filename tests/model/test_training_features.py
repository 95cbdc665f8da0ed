"""Remat policies and mixed precision do not change what the model computes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vt.model.config import preset
from vt.model.qwen2 import create_model


def _loss_and_grads(cfg, seed=0):
    model = create_model(cfg, seed=seed)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 16)), jnp.int32)

    def loss_fn(m):
        logits, _ = m(tokens[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    return float(loss), jax.tree.leaves(nnx.state(grads))


@pytest.mark.parametrize("policy", ["full", "dots", "dots_no_batch"])
def test_remat_policies_give_identical_gradients(policy):
    base = preset("tiny", remat_policy="none")
    loss0, g0 = _loss_and_grads(base)
    loss1, g1 = _loss_and_grads(base.replace(remat_policy=policy))
    assert loss0 == pytest.approx(loss1, abs=1e-6)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_auto_remat_is_decided_from_the_width():
    from vt.model.config import FULL_REMAT_BELOW_WIDTH, resolve_remat
    assert preset("tiny").remat_policy == "auto"
    assert resolve_remat("auto", preset("tiny").hidden_size) == "full"
    assert resolve_remat("auto", preset("qwen2.5-0.5b").hidden_size) == "none"
    assert resolve_remat("auto", FULL_REMAT_BELOW_WIDTH - 1) == "full"
    assert resolve_remat("auto", FULL_REMAT_BELOW_WIDTH) == "none"
    for policy in ("none", "full", "dots", "dots_no_batch"):
        assert resolve_remat(policy, 96) == resolve_remat(policy, 4096) == policy


def test_param_and_compute_dtypes_are_separate():
    cfg = preset("tiny", param_dtype="float32", dtype="bfloat16")
    model = create_model(cfg)
    assert model.layers.mlp.up_kernel.get_value().dtype == jnp.float32
    logits, _ = model(jnp.zeros((1, 4), jnp.int32))
    assert logits.dtype == jnp.float32  # logits always come back in fp32 for a stable loss
    loss16, _ = _loss_and_grads(cfg)
    loss32, _ = _loss_and_grads(cfg.replace(dtype="float32"))
    assert abs(loss16 - loss32) < 0.05 * abs(loss32)
