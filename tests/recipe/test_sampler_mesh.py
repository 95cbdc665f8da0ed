"""The mesh of the recipe's sampler-only stages (profile, select, the probe table: their `mesh` field,
vt.recipe.stages): the checkpoint sharded over this host's devices samples what it samples on one device."""
import jax
import numpy as np
import pytest

from vt.checkpoint.params import save_model
from vt.data.tasks import task_records
from vt.data.tokenizer import build_tiny_tokenizer
from vt.io import write_jsonl
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.recipe.stages import Context, RecipeConfig, _load_limited, _Verifier
from vt.sampling.config import SamplerConfig
from vt.sharding import MeshConfig


@pytest.mark.devices(2)
def test_verifier_sharded_over_two_devices_samples_as_on_one(tmp_path):
    assert len(jax.devices()) == 2
    cfg = preset("tiny")
    save_model(tmp_path / "ckpt", create_model(cfg, seed=0))
    build_tiny_tokenizer(tmp_path / "tok", vocab_size=cfg.vocab_size)
    write_jsonl(tmp_path / "probe.jsonl", task_records("math", 3, 0, split="eval", with_answer=False))
    records = _load_limited(str(tmp_path / "probe.jsonl"), 0, "probe")
    ctx = Context(RecipeConfig(tokenizer=str(tmp_path / "tok")), tmp_path)
    sampler = SamplerConfig(n=2, max_new_tokens=12, batch_size=4, temperature=1.0, seed=3, stop_token_ids=())
    out = {}
    for name, mesh in (("one", MeshConfig(data=1, fsdp=1, tensor=1)), ("two", MeshConfig(data=1, fsdp=-1, tensor=1))):
        v = _Verifier(ctx, ["math"], sampler, mesh)
        try:
            v.load(str(tmp_path / "ckpt"))
            out[name] = v.score(records, "math", seed=7).samples
            sharded = v.mesh is not None and "fsdp" in str(v.engine.state["embed"][...].sharding.spec)
        finally:
            v.close()
    assert sharded  # the two-device run did shard the weights
    one, two = ([s for group in out[k] for s in group] for k in ("one", "two"))
    assert [s.completion_ids for s in one] == [s.completion_ids for s in two]
    assert max(float(np.max(np.abs(np.subtract(a.logprobs, b.logprobs)))) for a, b in zip(one, two)) < 1e-4
