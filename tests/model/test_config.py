import json

import pytest

from vt import VtError
from vt.model.config import PRESETS, from_hf_config, param_count, preset, to_hf_config


def test_coder_3b_parameter_count():
    assert param_count(preset("qwen2.5-coder-3b")) == 3_085_938_688


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_hf_config(name):
    cfg = PRESETS[name]
    back = from_hf_config(json.loads(json.dumps(to_hf_config(cfg))))
    arch = lambda c: {k: v for k, v in c.to_dict().items() if k not in ("param_dtype", "dtype")}  # noqa: E731
    assert arch(back) == arch(cfg)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_hf_config_matches_transformers_param_count(name):
    import transformers
    for tie in (True, False):
        cfg = preset(name, tie_word_embeddings=tie)
        hf_cfg = to_hf_config(cfg)
        cls = getattr(transformers, hf_cfg["architectures"][0])
        hf = cls(cls.config_class(**{k: v for k, v in hf_cfg.items() if k != "architectures"}))
        assert param_count(cfg) == sum(p.numel() for p in hf.parameters())


# The model cards' "Number of Parameters" and "(Non-Embedding)", to the digits they print (Qwen/Qwen3-*,
# Qwen3-4B-*-2507 and Qwen2.5-1.5B, whose shape Qwen2.5-Math-1.5B shares): the presets' shapes, not vt's formula,
# are under test here; the formula is checked against transformers above.
@pytest.mark.parametrize("name,total,non_embedding", [
    ("qwen3-0.6b", "0.6", "0.44"), ("qwen3-1.7b", "1.7", "1.4"), ("qwen3-4b", "4.0", "3.6"),
    ("qwen3-4b-2507", "4.0", "3.6"), ("qwen3-8b", "8.2", "6.95"), ("qwen2.5-math-1.5b", "1.54", "1.31")])
def test_preset_sizes_match_model_cards(name, total, non_embedding):
    cfg = preset(name)
    embedding = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    billions = lambda n, like: f"{n / 1e9:.{len(like.split('.')[1])}f}"  # noqa: E731
    assert (billions(param_count(cfg), total), billions(param_count(cfg) - embedding, non_embedding)) == (
        total, non_embedding)


def test_qwen3_preset_is_transformers_qwen3():
    cfg = preset("qwen3-0.6b")
    hf = to_hf_config(cfg)
    assert (hf["model_type"], hf["architectures"], hf["head_dim"], hf["attention_bias"]) == (
        "qwen3", ["Qwen3ForCausalLM"], 128, False)
    assert cfg.head_dim * cfg.num_heads != cfg.hidden_size  # 16 x 128 = 2048 against hidden 1024


@pytest.mark.parametrize("change,field", [
    ({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}, "model_type"),
    ({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForCausalLM"]}, "model_type"),
    ({"architectures": ["Qwen2ForCausalLM"]}, "model_type"),  # qwen3 model_type, Qwen2 class
    ({"attention_bias": True}, "attention_bias"),
    ({"attention_bias": "no"}, "attention_bias"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
])
def test_unsupported_qwen3_configs_are_named(change, field):
    hf = {**to_hf_config(preset("tiny-qwen3")), **change}
    with pytest.raises(VtError, match=field):
        from_hf_config(hf)


def test_qwen3_head_dim_defaults_as_transformers():
    """A Qwen3 config.json without head_dim means Qwen3Config's default, 128, not hidden / heads."""
    from transformers import Qwen3Config
    hf = to_hf_config(preset("tiny-qwen3"))
    del hf["head_dim"]
    assert from_hf_config(hf).head_dim == Qwen3Config(**{k: v for k, v in hf.items() if k != "architectures"}).head_dim


def test_architecture_fields_no_family_has_are_refused():
    with pytest.raises(VtError, match="qk_norm"):
        preset("tiny", qk_norm=True)
    with pytest.raises(VtError, match="attention_bias"):
        preset("tiny", attention_bias=False)


@pytest.mark.parametrize("change,field", [
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"num_attention_heads": 5}, "num_heads"),
])
def test_unsupported_hf_configs_are_named(change, field):
    hf = {**to_hf_config(preset("tiny")), **change}
    with pytest.raises(VtError, match=field):
        from_hf_config(hf)


def test_missing_field_named():
    hf = to_hf_config(preset("tiny"))
    del hf["hidden_size"]
    with pytest.raises(VtError, match="hidden_size"):
        from_hf_config(hf)


def test_vocab_padding():
    cfg = preset("tiny", vocab_size=300)
    assert cfg.padded_vocab_size == 384
    assert param_count(cfg, padded=True) - param_count(cfg) == 84 * cfg.hidden_size
