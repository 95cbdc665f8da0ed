"""The model sharded over a (data 2, fsdp 2, tensor 2) mesh of 8 simulated CPU devices."""
import pytest

from testutil import run_multidevice
from vt import VtError
from vt.sharding import LOGICAL_RULES, logical_to_spec


def test_sharded_logits_and_param_shardings(hf_dir, vt_ckpt):
    out = run_multidevice(f"""
        import jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from vt.checkpoint import load_model
        from vt.checkpoint.params import model_from_hf
        from vt.model import create_model
        from vt.sharding import MeshConfig, make_mesh, use_mesh, logical_to_spec
        assert len(jax.devices()) == 8
        mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
        ref = load_model("{vt_ckpt}")
        sharded = load_model("{vt_ckpt}", mesh=mesh)
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

        @jax.jit
        def fwd(graphdef, state, tokens):
            return nnx.merge(graphdef, state)(tokens)[0]
        graphdef, state = nnx.split(sharded)
        with use_mesh(mesh):
            logits = fwd(graphdef, state, jax.device_put(tokens, jax.NamedSharding(mesh, jax.P(("data", "fsdp")))))
        np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5, rtol=0)

        # created directly sharded (never whole on one device) and converted straight into the mesh
        fresh = create_model(sharded.cfg, mesh=mesh)
        assert len(fresh.layers[0].mlp.up_kernel.get_value().sharding.device_set) == 8
        from_hf = model_from_hf("{hf_dir}", mesh=mesh)
        assert from_hf.layers[1].attn.q_kernel.get_value().sharding == sharded.layers[1].attn.q_kernel.get_value().sharding
        with use_mesh(mesh):
            np.testing.assert_allclose(np.asarray(fwd(*nnx.split(from_hf), tokens)), expected, atol=1e-5, rtol=0)
        print("OK", n_sharded)
    """)
    assert "OK" in out


def test_rule_table_rejects_collisions_and_unknown_names():
    with pytest.raises(VtError, match="twice"):
        logical_to_spec(("embed", "embed"))
    with pytest.raises(VtError, match="no rule"):
        logical_to_spec(("embed", "experts"))
    assert tuple(logical_to_spec(("embed", "mlp"))) == (LOGICAL_RULES["embed"], LOGICAL_RULES["mlp"])
