"""Remat policies and mixed precision do not change what the model computes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend.core import jaxprs_in_params

from vt.model.attention import ATTENTION_BLOCK
from vt.model.config import preset
from vt.model.qwen2 import create_model


def _loss_and_grads(cfg, seed=0, seq=16):
    model = create_model(cfg, seed=seed)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (2, seq)), jnp.int32)

    def loss_fn(m):
        logits, _ = m(tokens[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    return float(loss), jax.tree.leaves(nnx.state(grads))


@pytest.mark.parametrize("policy", ["full", "save_attention", "dots", "dots_no_batch"])
@pytest.mark.parametrize("seq", [16, 2 * ATTENTION_BLOCK + 9])  # dense attention; blocked, with a partial block
def test_remat_policies_give_identical_gradients(policy, seq):
    base = preset("tiny", remat_policy="none")
    loss0, g0 = _loss_and_grads(base, seq=seq)
    loss1, g1 = _loss_and_grads(base.replace(remat_policy=policy), seq=seq)
    assert loss0 == pytest.approx(loss1, abs=1e-6)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_auto_remat_is_decided_from_the_width():
    from vt.model.config import REMAT_BELOW_WIDTH, resolve_remat
    assert preset("tiny").remat_policy == "auto"
    assert resolve_remat("auto", preset("tiny").hidden_size) == "save_attention"
    assert resolve_remat("auto", preset("qwen2.5-0.5b").hidden_size) == "none"
    assert resolve_remat("auto", REMAT_BELOW_WIDTH - 1) == "save_attention"
    assert resolve_remat("auto", REMAT_BELOW_WIDTH) == "none"
    for policy in ("none", "full", "save_attention", "dots", "dots_no_batch"):
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


def _primitive_count(jaxpr, name: str) -> int:
    """How often primitive `name` occurs in `jaxpr`, nested jaxprs (scan, while, remat bodies) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for sub in jaxprs_in_params(eqn.params):
            count += _primitive_count(sub, name)
    return count


def test_save_attention_skips_the_attention_loops_when_recomputing():
    """With "save_attention" the backward pass's rematerialised layer does not run the blocked attention's forward
    loops again: the gradient has one while loop fewer than under "full" (the forward's key-block loop, the
    recompute's, the backward's query-block loop)."""
    cfg = preset("tiny", remat_policy="full")
    tokens = jnp.zeros((2, 2 * ATTENTION_BLOCK), jnp.int32)

    def whiles(policy):
        model = create_model(cfg.replace(remat_policy=policy))
        graphdef, state = nnx.split(model)

        def loss(s):
            logits, _ = nnx.merge(graphdef, s)(tokens)
            return logits.sum()
        return _primitive_count(jax.make_jaxpr(jax.grad(loss))(state).jaxpr, "while")

    assert whiles("save_attention") == whiles("full") - 1
