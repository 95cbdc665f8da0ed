"""Chunked log-probs (vt.train.losses.token_logps) equal the full-logits computation, and do not hold [B, T, V].

The reference is the plain forward (ModelDef.apply: float32 logits [B, T, vocab_size]) then log_softmax. Rows
are packed (2-3 documents each, segment ids), carry masked tokens and trailing padding, the vocabulary is
padded (500 -> 512 rows of the head, which must never score) and the chunk does not divide the row length.
Tolerances (fp32): loss within 1e-6 relative, log-probs, entropy and gradients within 1e-5.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from train_helpers import assert_logps_equal, chunked_logps, random_batch, reference_logps, value_and_grad_of


def _setup(tie: bool, mesh=None):
    from vt.checkpoint.params import flat_params
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.train.state import ModelDef
    cfg = preset("tiny", vocab_size=500, tie_word_embeddings=tie)
    assert cfg.padded_vocab_size == 512  # the head has 12 rows that must never score
    return ModelDef(cfg), flat_params(create_model(cfg, mesh, seed=0))


@pytest.mark.parametrize("tie,temperature,chunk", [(True, 1.0, 20), (False, 0.7, 16), (False, 0.7, 4096)])
def test_chunked_logps_loss_and_gradients_equal_full_logits(tie, temperature, chunk):
    md, params = _setup(tie)
    batch = {k: jnp.asarray(v[0]) for k, v in random_batch(np.random.default_rng(5), 1, 3, 48, vocab=500).items()}
    assert 0 < float(batch["loss_mask"].sum()) < float((batch["segment_ids"] > 0).sum())  # masked tokens exist
    ref = value_and_grad_of(lambda p, b: reference_logps(md, p, b, temperature))(params, batch)
    got = value_and_grad_of(lambda p, b: chunked_logps(md, p, b, temperature, chunk))(params, batch)
    assert_logps_equal(ref, got)


def test_chunking_bounds_the_compiled_memory():
    """Forward and backward of the log-probs hold one chunk's logits (and their few elementwise companions), not
    [B, T, V]: the compiled temporary memory at chunk 64 (1/16 of the row) is under a quarter of the float32
    logits, while one whole-row chunk needs at least them (so the bound measures the chunking)."""
    from vt.train.losses import token_logps
    B, T, D, V = 2, 1024, 32, 8192
    logits_bytes = B * T * V * 4

    def temp_bytes(chunk):
        def loss(x, head, t):
            return jnp.sum(token_logps(x, head, t, vocab_size=V - 5, dtype="float32", chunk=chunk))
        args = (jax.ShapeDtypeStruct((B, T, D), jnp.float32), jax.ShapeDtypeStruct((D, V), jnp.float32),
                jax.ShapeDtypeStruct((B, T), jnp.int32))
        return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes(T) >= logits_bytes
    assert temp_bytes(64) < logits_bytes / 4


def test_bad_chunk_is_an_error():
    from vt import VtError
    from vt.train.losses import token_logps
    from vt.train.loop import ModelInitConfig
    with pytest.raises(VtError, match="loss_chunk: must be >= 1"):  # a config file's loader names it model.loss_chunk
        ModelInitConfig(loss_chunk=0)
    with pytest.raises(ValueError, match="chunk"):
        token_logps(jnp.zeros((1, 4, 8)), jnp.zeros((8, 16)), jnp.zeros((1, 4), jnp.int32), vocab_size=16,
                    dtype="float32", chunk=0)


@pytest.mark.devices(8)
def test_chunked_logps_on_the_8_device_mesh():
    """data 2 x fsdp 2 x tensor 2 (batch split over data x fsdp, vocab over tensor): the sharded chunked loss,
    log-probs, entropy and gradients equal one device's full-logits reference."""
    from jax.sharding import NamedSharding
    from vt.checkpoint.params import flat_params
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.sharding import MeshConfig, logical_to_spec, make_mesh, use_mesh
    from vt.train.state import ModelDef

    cfg = preset("tiny", vocab_size=500, tie_word_embeddings=False)
    md = ModelDef(cfg)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    batch = {k: jnp.asarray(v[0]) for k, v in random_batch(np.random.default_rng(6), 1, 4, 40, vocab=500).items()}
    ref = value_and_grad_of(lambda p, b: reference_logps(md, p, b, 0.7))(flat_params(create_model(cfg, seed=1)), batch)
    sharded = flat_params(create_model(cfg, mesh=mesh, seed=1))
    assert sharded["lm_head"].sharding.spec[1] == "tensor", sharded["lm_head"].sharding.spec
    batch = jax.device_put(batch, NamedSharding(mesh, logical_to_spec(("batch", "sequence"))))
    with use_mesh(mesh):
        got = value_and_grad_of(lambda p, b: chunked_logps(md, p, b, 0.7, 16))(sharded, batch)
    assert_logps_equal(ref, got)
