"""The decoder stack is scanned: the programs vt compiles are the same size at any depth.

Compile time follows program size, and with layers unrolled every layer added a copy of the layer body to
the train step, the sampler's prefill and decode, and the random init (36 copies at coder-3b). These tests
lower (trace, no compile) each program at two depths and require the same number of operations: a layer loop
unrolled anywhere fails them. bench/compile.py measures the compile seconds themselves.
"""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vt.model.config import preset
from vt.model.kv_pages import PagedKVCache
from vt.model.qwen2 import DecoderLayer, abstract_model, create_model, init_fn, init_key
from vt.sampling import steps
from vt.sampling.rules import SamplingParams
from vt.sharding import abstract_of
from vt.train.state import ModelDef

DEPTHS = (2, 5)


def _ops(lowered) -> int:
    """Operations in the lowered StableHLO module (one per `=` assignment or op line)."""
    return len(re.findall(r"^\s*(?:%\S+ = )?\"?[a-z_]+\.[a-z_.]+", lowered.as_text(), flags=re.M))


def _cfg(layers: int, **kw):
    return preset("tiny", num_layers=layers, dtype="float32", **kw)


def _train_grad(layers: int, remat: str = "full"):
    md = ModelDef(_cfg(layers, remat_policy=remat))
    tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)

    def loss(params, t):
        return jnp.mean(md.apply(params, t, jnp.broadcast_to(jnp.arange(16), (2, 16)), jnp.ones((2, 16), jnp.int32)))
    return jax.jit(jax.grad(loss)).lower(md.abstract_params(), tokens)


def _sampler(layers: int, which: str):
    cfg = _cfg(layers)
    graphdef, state = nnx.split(abstract_model(cfg))
    Z, n_pages = 16, 130
    if which == "prefill":
        cache = abstract_of(PagedKVCache.abstract(cfg, n_pages, Z, PagedKVCache.table_info(2, 1)))
        return jax.jit(functools.partial(steps.prefill, graphdef)).lower(
            state, cache, jax.ShapeDtypeStruct((2, 16), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32))
    B, S = 2, 1024  # >= 2 page blocks: the blockwise paged attention is in the program too
    cache = abstract_of(PagedKVCache.abstract(cfg, n_pages, Z, PagedKVCache.table_info(B, S // Z)))
    slots = abstract_of(steps.Slots.abstract(B))
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    fn = functools.partial(steps.decode, graphdef, params=SamplingParams(1.0, 1.0, -1), stop_ids=(0,),
                           steps_per_call=8)
    return jax.jit(fn).lower(state, cache, slots, i32, i32)


def _init(layers: int):
    return init_fn(_cfg(layers)).lower(init_key(0))


def test_train_step_program_size_does_not_grow_with_depth():
    shallow, deep = (_ops(_train_grad(n, "full")) for n in DEPTHS)
    assert shallow == deep, (shallow, deep)


def test_prefill_and_decode_program_size_does_not_grow_with_depth():
    for which in ("prefill", "decode"):
        shallow, deep = (_ops(_sampler(n, which)) for n in DEPTHS)
        assert shallow == deep, (which, shallow, deep)


def test_random_init_program_size_does_not_grow_with_depth():
    shallow, deep = (_ops(_init(n)) for n in DEPTHS)
    assert shallow == deep, (shallow, deep)


def test_random_init_compiles_once_for_every_seed_and_draws_what_the_seed_gives():
    """The seed is an input of the init program, not a constant in it: a second seed reuses the compilation, and
    each seed draws exactly the weights the model built with nnx.Rngs(seed) has (the seed as a constant; a seed
    past int32 too)."""
    from vt.model.qwen2 import Qwen2

    cfg = _cfg(2)
    for seed in (3, 2**31 + 5):
        drawn = jax.tree.leaves(nnx.state(create_model(cfg, seed=seed)))
        constant = jax.tree.leaves(jax.jit(lambda: nnx.state(Qwen2(cfg, rngs=nnx.Rngs(seed))))())  # noqa: B023
        assert len(drawn) == len(constant) and all(np.array_equal(a, b) for a, b in zip(drawn, constant)), seed
    assert init_fn(cfg, None)._cache_size() == 1


def test_scanned_stack_equals_layers_applied_one_by_one():
    """The scan runs layer i with weights i, in order: equal to applying each layer's slice in a Python loop."""
    cfg = _cfg(3, remat_policy="full")
    model = create_model(cfg, seed=1)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 12)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
    seg = jnp.asarray([[1] * 7 + [2] * 5, [1] * 12], jnp.int32)
    got, _ = model.hidden_states(tokens, pos, seg)

    graphdef, stacked = nnx.split(model.layers)
    x = model.embed[...][tokens]
    for i in range(cfg.num_layers):
        layer: DecoderLayer = nnx.merge(graphdef, jax.tree.map(lambda w: w[i], stacked))
        x, _ = layer(x, pos, seg)
    want = model.final_norm(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)
