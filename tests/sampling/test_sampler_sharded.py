"""Sampling on a real 8-device CPU mesh (tensor parallel x fsdp) equals single-device sampling; weight updates
on the mesh do not retrace."""
import jax
import numpy as np
import pytest
from flax import nnx

from vt import VtError
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.sampling.config import Request, SamplerConfig
from vt.sampling.engine import Engine
from vt.sharding import MeshConfig, make_mesh


@pytest.mark.devices(8)
def test_sharded_sampling_equals_single_device_and_updates_without_retrace():
    assert len(jax.devices()) == 8
    cfg = preset("tiny")
    rng = np.random.RandomState(0)
    reqs = [Request(rng.randint(0, 512, rng.randint(2, 30)).tolist(), max_new_tokens=int(m), n=2)
            for m in [3, 20, 5, 5, 12, 3, 30, 4, 6, 8]]
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    single, sharded = create_model(cfg, seed=3), create_model(cfg, mesh=mesh, seed=3)
    jax.tree.map(np.testing.assert_array_equal, nnx.state(single), nnx.state(sharded))
    report = {}
    for temp in (0.0, 1.0):
        sc = SamplerConfig(batch_size=8, temperature=temp, top_p=0.9, top_k=40, seed=1, steps_per_call=8)
        a = Engine(single, sc).generate(reqs)
        eng = Engine(sharded, sc, mesh=mesh)
        b = eng.generate(reqs)
        ids = lambda r: [[s.completion_ids for s in x] for x in r]
        report[f"ids_equal_{temp}"] = ids(a) == ids(b)
        report[f"logprob_diff_{temp}"] = max(float(np.max(np.abs(np.subtract(s.logprobs, t.logprobs))))
                                             for x, y in zip(a, b) for s, t in zip(x, y))
    report["tensor_sharded"] = "tensor" in str(eng.state["layers"]["attn"]["q_kernel"][...].sharding.spec)
    with pytest.raises(VtError, match="decode_attention.*splits the KV heads"):  # the kernel needs whole heads
        Engine(sharded, SamplerConfig(decode_attention="pallas"), mesh=mesh)
    # a learner state laid out differently (here: one device) moves device-to-device into the engine's sharding
    count = eng.compile_count
    _, new_state = nnx.split(create_model(cfg, seed=4))
    eng.update_weights(new_state)
    after = eng.generate(reqs, seed=5)
    ref = Engine(create_model(cfg, seed=4), eng.cfg).generate(reqs, seed=5)
    report["retraced"] = eng.compile_count - count
    report["updated_equal"] = [[s.completion_ids for s in x] for x in after] == [[s.completion_ids for s in x] for x in ref]
    # Long samples (70 pages of 16 tokens: decode attends page block by page block) on the mesh.
    long_reqs = [Request(rng.randint(0, 512, 10).tolist(), max_new_tokens=1100) for _ in range(4)]
    sc = SamplerConfig(batch_size=4, temperature=1.0, seed=2, steps_per_call=128, stop_token_ids=())
    a = Engine(single, sc).generate(long_reqs)
    b = Engine(sharded, sc, mesh=mesh).generate(long_reqs)
    report["long_ids_equal"] = [x[0].completion_ids for x in a] == [x[0].completion_ids for x in b]
    report["long_logprob_diff"] = max(float(np.max(np.abs(np.subtract(x[0].logprobs, y[0].logprobs)))) for x, y in zip(a, b))
    assert report["ids_equal_0.0"] and report["ids_equal_1.0"], report
    assert report["logprob_diff_1.0"] < 1e-4 and report["logprob_diff_0.0"] == 0.0, report
    assert report["tensor_sharded"], report
    assert report["retraced"] == 0 and report["updated_equal"], report
    assert report["long_ids_equal"] and report["long_logprob_diff"] < 1e-4, report
