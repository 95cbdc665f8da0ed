"""LoRA adapters (vt.model.lora): B = 0 is the base model exactly; trained adapters export merged (transformers'
logits equal vt's adapted model's) and as a PEFT directory (peft's logits equal too); sharding by the table."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vt import VtError
from vt.checkpoint.params import flat_params, load_model, merge_adapters, save_model
from vt.model import lora
from vt.model.config import preset
from vt.model.qwen2 import create_model

FP32_TOL = 1e-5  # max-abs logit difference, float32 (as tests/model/test_parity.py)


def _tokens(cfg, B=3, T=11, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, cfg.vocab_size, (B, T)), jnp.int32)


def _with_random_b(model, seed=1):
    """The model with every adapter B drawn (as training would leave it), so the adapters' term is not zero."""
    params = flat_params(model)
    rng = np.random.default_rng(seed)
    for k, v in params.items():
        if k.endswith("_lora_b"):
            params[k] = jnp.asarray(rng.normal(0, 0.05, v.shape), v.dtype)
    from flax import nnx
    graphdef, state = nnx.split(model)
    state = nnx.map_state(lambda path, var: var.replace(params[".".join(map(str, path))]) if
                          ".".join(map(str, path)) in params else var, state)
    return nnx.merge(graphdef, state)


def test_zero_b_is_the_base_model_exactly_and_base_init_is_unchanged():
    cfg = preset("tiny")
    base = create_model(cfg, seed=3)
    adapted = create_model(cfg.replace(lora_rank=4), seed=3)
    pb, pa = flat_params(base), flat_params(adapted)
    adapters = sorted(k for k in pa if lora.is_adapter(k))
    assert len(adapters) == 14 and set(pa) - set(adapters) == set(pb)
    assert all(np.array_equal(pb[k], pa[k]) for k in pb)  # the same base weights from the same seed
    assert pa["layers.attn.q_lora_a"].shape == (3, 96, 4) and pa["layers.attn.q_lora_b"].shape == (3, 4, 6, 16)
    assert pa["layers.attn.o_lora_a"].shape == (3, 6, 16, 4) and pa["layers.mlp.down_lora_b"].shape == (3, 4, 96)
    assert pa["layers.attn.q_lora_a"].dtype == jnp.float32
    tokens = _tokens(cfg)
    assert np.array_equal(np.asarray(base(tokens)[0]), np.asarray(adapted(tokens)[0]))
    # and the merged form of a B = 0 model is the base model's weights bitwise
    merged = flat_params(merge_adapters(adapted))
    assert set(merged) == set(pb) and all(np.array_equal(pb[k], merged[k]) for k in pb)


def test_targets_select_projections_and_bad_values_are_named():
    cfg = preset("tiny")
    keys = flat_params(create_model(cfg.replace(lora_rank=2, lora_targets="q|v"), seed=0))
    assert sorted(k for k in keys if lora.is_adapter(k)) == [
        "layers.attn.q_lora_a", "layers.attn.q_lora_b", "layers.attn.v_lora_a", "layers.attn.v_lora_b"]
    with pytest.raises(VtError, match="lora_targets.*matches none"):
        cfg.replace(lora_rank=2, lora_targets="qkv")
    with pytest.raises(VtError, match="lora_targets.*not a regular expression"):
        cfg.replace(lora_rank=2, lora_targets="(q")
    with pytest.raises(VtError, match="lora_rank"):
        cfg.replace(lora_rank=-1)


def test_merged_params_compute_the_adapted_model():
    cfg = preset("tiny").replace(lora_rank=4, lora_alpha=8.0)
    model = _with_random_b(create_model(cfg, seed=0))
    tokens = _tokens(cfg)
    adapted = np.asarray(model(tokens)[0])
    merged = np.asarray(merge_adapters(model)(tokens)[0])
    assert np.abs(adapted - np.asarray(create_model(preset("tiny"), seed=0)(tokens)[0])).max() > 1e-2
    assert np.abs(adapted - merged).max() < FP32_TOL


def test_adapters_are_sharded_like_their_kernels():
    """Each adapter carries its kernel's input (A) or output (B) logical axes, the rank axis never split, and
    the mesh shardings come from the one table like every other parameter's."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P
    from vt.model.qwen2 import abstract_model
    from vt.sharding import MeshConfig, logical_to_spec, make_mesh
    from vt.train.state import ModelDef
    cfg = preset("tiny").replace(lora_rank=4)
    axes = {".".join(map(str, p)): v.get_metadata()["axes"] for p, v in nnx.to_flat_state(nnx.state(abstract_model(cfg)))}
    assert logical_to_spec(axes["layers.attn.q_lora_a"]) == P(None, "fsdp", None)
    assert logical_to_spec(axes["layers.attn.q_lora_b"]) == P(None, None, "tensor", None)
    assert logical_to_spec(axes["layers.attn.o_lora_a"]) == P(None, "tensor", None, None)
    assert logical_to_spec(axes["layers.mlp.down_lora_a"]) == P(None, "tensor", None)
    assert logical_to_spec(axes["layers.mlp.down_lora_b"]) == P(None, None, "fsdp")
    sh = ModelDef(cfg).param_shardings(make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1]))
    assert all(k in sh for k in axes)


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen3"])
def trained_ckpt(request, tmp_path_factory):
    """A LoRA checkpoint whose adapters are not zero (B drawn), untied head so both HF layouts are exercised; of
    each architecture (Qwen2, Qwen3)."""
    cfg = preset(request.param).replace(lora_rank=4, lora_alpha=8.0, tie_word_embeddings=False, lora_targets=".*")
    model = _with_random_b(create_model(cfg, seed=0))
    path = tmp_path_factory.mktemp("lora") / "ck"
    save_model(path, model)
    return path, model


def _hf_logits(model, tokens):
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens))).logits.float().numpy()


def test_merged_export_matches_transformers(trained_ckpt, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    from testutil import run_vt
    path, model = trained_ckpt
    run_vt("convert", "orbax-to-hf", str(path), str(tmp_path / "hf"), "--no-tokenizer", check=True)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == (
        "qwen3" if model.cfg.qk_norm else "qwen2")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokens = _tokens(model.cfg)
    ours = np.asarray(load_model(path)(tokens)[0])
    assert np.abs(_hf_logits(hf, tokens) - ours).max() < FP32_TOL


def test_peft_export_loads_in_peft_with_the_same_logits(trained_ckpt, tmp_path):
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM
    from testutil import run_vt
    path, model = trained_ckpt
    out = tmp_path / "peft"
    run_vt("convert", "orbax-to-hf", str(path), str(out), "--lora-format", "peft", "--no-tokenizer", check=True)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(out / "base_model", dtype=torch.float32).eval()
    tokens = _tokens(model.cfg)
    base_logits = _hf_logits(base, tokens)
    peft_model = peft.PeftModel.from_pretrained(base, out).eval()
    ours = np.asarray(model(tokens)[0])
    assert np.abs(_hf_logits(peft_model, tokens) - ours).max() < FP32_TOL
    assert np.abs(base_logits - ours).max() > 1e-2  # the adapters do change the function


def test_peft_export_of_a_plain_checkpoint_is_refused(tmp_path):
    from testutil import run_vt
    save_model(tmp_path / "ck", create_model(preset("tiny"), seed=0))
    r = run_vt("convert", "orbax-to-hf", str(tmp_path / "ck"), str(tmp_path / "out"), "--lora-format", "peft", "--no-tokenizer")
    assert r.returncode != 0 and "no LoRA adapters" in r.stderr


def test_vt_merge_folds_adapters_in(trained_ckpt, tmp_path):
    from vt.train.merge import merge_checkpoints
    path, model = trained_ckpt
    merge_checkpoints([path, path], tmp_path / "m")
    merged = load_model(tmp_path / "m")
    assert merged.cfg.lora_rank == 0
    tokens = _tokens(model.cfg)
    assert np.abs(np.asarray(merged(tokens)[0]) - np.asarray(model(tokens)[0])).max() < FP32_TOL


def test_dropout_only_under_a_key():
    cfg = preset("tiny").replace(lora_rank=4, lora_dropout=0.5)
    model = _with_random_b(create_model(cfg, seed=0))
    tokens = _tokens(cfg)
    plain = np.asarray(model(tokens)[0])
    with lora.dropout_key(jax.random.key(1)):
        dropped = np.asarray(model(tokens)[0])
    with lora.dropout_key(jax.random.key(1)):
        again = np.asarray(model(tokens)[0])
    assert np.array_equal(dropped, again) and np.abs(dropped - plain).max() > 1e-3
