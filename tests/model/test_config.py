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


def test_hf_config_matches_transformers_param_count():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    for tie in (True, False):
        cfg = preset("tiny", tie_word_embeddings=tie)
        hf = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in to_hf_config(cfg).items() if k != "architectures"}))
        assert param_count(cfg) == sum(p.numel() for p in hf.parameters())


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
