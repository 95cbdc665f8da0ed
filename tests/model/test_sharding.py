"""The model sharded over a (data 2, fsdp 2, tensor 2) mesh of 8 simulated CPU devices."""
import pytest

from vt import VtError
from vt.sharding import LOGICAL_RULES, logical_to_spec


@pytest.mark.devices(8)
def test_sharded_logits_and_param_shardings(hf_dir, vt_ckpt):
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from vt.checkpoint.params import load_model, model_from_hf
    from vt.model.qwen2 import create_model
    from vt.sharding import MeshConfig, make_mesh, use_mesh, logical_to_spec
    assert len(jax.devices()) == 8
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    ref = load_model(vt_ckpt)
    sharded = load_model(vt_ckpt, mesh=mesh)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 300, (4, 10)), jnp.int32)
    expected = np.asarray(ref(tokens)[0])

    # every parameter's sharding is exactly what the rule table says, and it is spread over devices
    n_sharded = 0
    for path, var in nnx.to_flat_state(nnx.state(sharded, nnx.Param)):
        arr = var.get_value()
        want = logical_to_spec(var.get_metadata()["axes"])
        assert arr.sharding.mesh.shape == mesh.shape
        got, want = tuple(arr.sharding.spec), tuple(want)
        got = got + (None,) * (len(want) - len(got))
        assert got == want, (path, got, want)
        n_sharded += any(s is not None for s in got)
        shard_shape = arr.addressable_shards[0].data.shape
        assert np.prod(shard_shape) * (1 if all(s is None for s in got) else 2) <= arr.size, path
    assert n_sharded > 0
    if sharded.cfg.qk_norm:  # Qwen3's per-head q/k norm weights [L, H] are replicated, as every norm
        for norm in (sharded.layers.attn.q_norm, sharded.layers.attn.k_norm):
            assert norm.weight.get_value().sharding.is_fully_replicated

    @jax.jit
    def fwd(graphdef, state, tokens):
        return nnx.merge(graphdef, state)(tokens)[0]
    graphdef, state = nnx.split(sharded)
    with use_mesh(mesh):
        logits = fwd(graphdef, state, jax.device_put(tokens, jax.NamedSharding(mesh, jax.P(("data", "fsdp")))))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5, rtol=0)

    # created directly sharded (never whole on one device) and converted straight into the mesh
    fresh = create_model(sharded.cfg, mesh=mesh)
    assert len(fresh.layers.mlp.up_kernel.get_value().sharding.device_set) == 8
    from_hf = model_from_hf(hf_dir, mesh=mesh)
    assert from_hf.layers.attn.q_kernel.get_value().sharding == sharded.layers.attn.q_kernel.get_value().sharding
    with use_mesh(mesh):
        np.testing.assert_allclose(np.asarray(fwd(*nnx.split(from_hf), tokens)), expected, atol=1e-5, rtol=0)
    print(n_sharded)


def test_rule_table_rejects_collisions_and_unknown_names():
    with pytest.raises(VtError, match="twice"):
        logical_to_spec(("embed", "embed"))
    with pytest.raises(VtError, match="no rule"):
        logical_to_spec(("embed", "experts"))
    assert tuple(logical_to_spec(("embed", "mlp"))) == (LOGICAL_RULES["embed"], LOGICAL_RULES["mlp"])


@pytest.mark.devices(8)
def test_fewer_kv_heads_than_tensor_shards():
    """8 query / 2 KV heads on tensor 4 (coder-3b has 16 / 2): the KV projections and the KV cache keep all KV
    heads on every tensor shard instead of failing; logits, gradients and greedy sampling equal one device's.
    Tolerance: 1e-5 absolute on logits and gradients (fp32; different reduction orders)."""
    import jax, jax.numpy as jnp, numpy as np
    from vt.checkpoint.params import flat_params
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    from vt.sharding import MeshConfig, make_mesh, use_mesh
    from vt.train.state import ModelDef

    cfg = preset("tiny", num_heads=8, num_kv_heads=2, dtype="float32")
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=4))
    ref, sharded = create_model(cfg, seed=3), create_model(cfg, mesh=mesh, seed=3)
    k = sharded.layers.attn.k_kernel.get_value()
    # [layers, embed, kv_heads, head_dim]: every layer on every device, kv_heads whole on each shard
    assert tuple(k.sharding.spec)[0] is None and tuple(k.sharding.spec)[2:3] in ((), (None,)), k.sharding.spec
    q = sharded.layers.attn.q_kernel.get_value()
    assert q.sharding.spec[2] == "tensor", q.sharding.spec  # query heads still split

    md = ModelDef(cfg)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 500, (4, 24)), jnp.int32)
    pos, seg = jnp.broadcast_to(jnp.arange(24), (4, 24)), jnp.ones((4, 24), jnp.int32)
    def loss(params, t):
        logits = md.apply(params, t, pos, seg)
        return jnp.mean(jax.nn.logsumexp(logits, -1)), logits
    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (l0, logits0), g0 = step(flat_params(ref), tokens)
    with use_mesh(mesh):
        (l1, logits1), g1 = step(flat_params(sharded), tokens)
    np.testing.assert_allclose(np.asarray(logits1), np.asarray(logits0), atol=1e-5, rtol=0)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=0)

    sc = SamplerConfig(batch_size=8, max_new_tokens=12, temperature=0.0, stop_token_ids=())
    reqs = [Request(prompt_ids=list(range(1 + i, 6 + 2 * i))) for i in range(6)]
    a = Engine(ref, sc).generate(reqs, seed=0)
    b = Engine(sharded, sc, mesh=mesh).generate(reqs, seed=0)
    assert [s[0].completion_ids for s in a] == [s[0].completion_ids for s in b]


def test_platform_is_the_mesh_devices_platform():
    """Hardware choices read the platform of the devices a program is built for (vt.sharding.platform): with no
    mesh the default backend, else the mesh's (given, or current under use_mesh). On CPU nothing changes: "auto"
    attention stays "xla" (tests/plan compiles for TPU meshes, where it is splash)."""
    import jax
    from vt.model.attention import resolve
    from vt.sharding import MeshConfig, make_mesh, platform, use_mesh
    assert platform() == jax.default_backend() == "cpu"
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    assert platform(mesh) == "cpu"
    with use_mesh(mesh):
        assert platform() == "cpu" and resolve("auto", "bfloat16") == "xla"
