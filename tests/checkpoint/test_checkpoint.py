"""Orbax <-> Hugging Face conversion: bitwise round trip, loadable exports, and clear errors on bad input."""
import json
from pathlib import Path

import ml_dtypes  # noqa: F401  registers bfloat16 with numpy for safetensors' numpy loader
import numpy as np
import torch
from safetensors.numpy import load_file

from testutil import make_hf_model, run_vt


def _tensors(d: Path) -> dict:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_roundtrip_is_bitwise_and_loads_in_transformers(hf_dir, vt_ckpt, tmp_path):
    """HF -> vt -> HF with default flags on both legs (`vt_ckpt` is `hf-to-orbax` without flags): the export
    keeps the checkpoint's float32, so nothing is lost unless a narrower --dtype is asked for."""
    from transformers import AutoModelForCausalLM
    out = tmp_path / "hf_out"
    run_vt("convert", "orbax-to-hf", str(vt_ckpt), str(out), "--no-tokenizer", check=True)
    original, exported = _tensors(hf_dir), _tensors(out)
    assert sorted(original) == sorted(exported)
    for k in original:
        assert original[k].dtype == exported[k].dtype and np.array_equal(original[k], exported[k]), k
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(original)
    assert (out / "generation_config.json").is_file()
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"

    a = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits)


def test_export_bf16_shards_and_copies_tokenizer(vt_ckpt_qwen2, tmp_path):
    from vt.data.tokenizer import build_tiny_tokenizer
    tok = tmp_path / "tok"
    build_tiny_tokenizer(tok, vocab_size=300)  # the test model's vocabulary
    out = tmp_path / "hf_bf16"
    # A tiny shard limit forces several shards, exercising the index the way a 3B export does.
    run_vt("convert", "orbax-to-hf", str(vt_ckpt_qwen2), str(out), "--dtype", "bfloat16", "--tokenizer", str(tok),
           "--max-shard-gb", "0.0001", check=True)
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    tensors = _tensors(out)
    assert {str(v.dtype) for v in tensors.values()} == {"bfloat16"}
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_info_reports_config_and_counts(vt_ckpt, hf_dir):
    for path in (vt_ckpt, hf_dir):
        proc = run_vt("info", str(path), "--json", check=True)
        d = json.loads(proc.stdout)
        hf = make_hf_model(tie=d["config"]["tie_word_embeddings"], arch="qwen3" if d["config"]["qk_norm"] else "qwen2")
        assert d["param_count"] == sum(p.numel() for p in hf.parameters())


# --- bad input: one clear line naming the file/field, non-zero exit, nothing half-written --------------------

def _assert_clean_failure(proc, *needles, out: Path | None = None):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vt convert ") and ": error:" in lines[0], proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    if out is not None:
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp")]


def test_missing_directory(tmp_path):
    out = tmp_path / "ck"
    _assert_clean_failure(run_vt("convert", "hf-to-orbax", str(tmp_path / "nope"), str(out)), "config.json", out=out)


def test_other_architecture_rejected(hf_dir_qwen2, tmp_path):
    bad = tmp_path / "llama"
    bad.mkdir()
    cfg = json.loads((hf_dir_qwen2 / "config.json").read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (bad / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "ck"
    _assert_clean_failure(run_vt("convert", "hf-to-orbax", str(bad), str(out)), "model_type", "llama", out=out)


def _copy_hf(src: Path, dst: Path):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())


def test_shape_mismatch_names_tensor(hf_dir_qwen2, tmp_path):
    bad = tmp_path / "bad"
    _copy_hf(hf_dir_qwen2, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 168
    (bad / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "ck"
    _assert_clean_failure(run_vt("convert", "hf-to-orbax", str(bad), str(out)), "gate_proj.weight", "shape", out=out)


def test_unmatched_key_is_an_error(hf_dir_qwen2, tmp_path):
    from safetensors.numpy import save_file
    bad = tmp_path / "extra"
    _copy_hf(hf_dir_qwen2, bad)
    tensors = _tensors(bad)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    for f in bad.glob("*.safetensors"):
        f.unlink()
    (bad / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(bad / "model.safetensors"))
    out = tmp_path / "ck"
    _assert_clean_failure(run_vt("convert", "hf-to-orbax", str(bad), str(out)), "rotary_emb.inv_freq", out=out)


def test_corrupted_safetensors(hf_dir_qwen2, tmp_path):
    bad = tmp_path / "corrupt"
    _copy_hf(hf_dir_qwen2, bad)
    f = next(bad.glob("*.safetensors"))
    data = bytearray(f.read_bytes())
    f.write_bytes(bytes(data[: len(data) // 2]))  # truncated mid-tensor
    out = tmp_path / "ck"
    _assert_clean_failure(run_vt("convert", "hf-to-orbax", str(bad), str(out)), f.name, out=out)


def test_unwritable_output_dir(vt_ckpt_qwen2, tmp_path):
    """An output path under a regular file cannot be created, even by root."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _assert_clean_failure(run_vt("convert", "orbax-to-hf", str(vt_ckpt_qwen2), str(blocker / "out"), "--no-tokenizer"), str(blocker / "out"))


def test_existing_output_is_not_overwritten(vt_ckpt_qwen2, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    _assert_clean_failure(run_vt("convert", "orbax-to-hf", str(vt_ckpt_qwen2), str(out), "--no-tokenizer"), "not empty")
    assert (out / "precious.txt").read_text() == "keep me"


def test_layers_are_stacked_in_hf_order(hf_dir):
    """Each HF per-layer tensor lands at its layer's index of the stacked vt array ([num_layers, ...])."""
    from vt.checkpoint.params import flat_params, model_from_hf
    flat = flat_params(model_from_hf(hf_dir))
    hf = _tensors(hf_dir)
    n = sum(1 for k in hf if k.endswith("mlp.up_proj.weight"))
    assert n > 1 and flat["layers.mlp.up_kernel"].shape[0] == n
    for i in range(n):
        np.testing.assert_array_equal(np.asarray(flat["layers.mlp.up_kernel"][i]),
                                      hf[f"model.layers.{i}.mlp.up_proj.weight"].T)
        np.testing.assert_array_equal(np.asarray(flat["layers.input_norm.weight"][i]),
                                      hf[f"model.layers.{i}.input_layernorm.weight"])


def test_per_layer_checkpoint_of_an_older_vt_is_a_clear_error(vt_ckpt_qwen2, tmp_path):
    """A params item written before the layers were stacked ("layers.0.attn.q_kernel" ...) is refused with a
    message saying what to do, not an Orbax stack trace."""
    import shutil

    import orbax.checkpoint as ocp
    import pytest

    from vt import VtError
    from vt.checkpoint.params import CONFIG_FILE, PARAMS_ITEM, flat_params, load_model
    flat = flat_params(load_model(vt_ckpt_qwen2))
    old = {}
    for key, w in flat.items():
        if key.startswith("layers."):
            old.update({f"layers.{i}.{key[len('layers.'):]}": np.asarray(w[i]) for i in range(w.shape[0])})
        else:
            old[key] = np.asarray(w)
    ckpt = tmp_path / "old"
    ckpt.mkdir()
    shutil.copyfile(vt_ckpt_qwen2 / CONFIG_FILE, ckpt / CONFIG_FILE)
    ocp.PyTreeCheckpointer().save(ckpt / PARAMS_ITEM, old)
    with pytest.raises(VtError, match="older vt with one entry per layer.*hf-to-orbax"):
        load_model(ckpt)


def test_hf_to_orbax_can_record_a_longer_context(tmp_path):
    """--max-position-embeddings (configs/vibethinker_1p5b.py's context extension) changes only that field: the
    weights are the same bits, rope_theta is config.json's."""
    from vt.checkpoint.params import flat_params, load_model, model_from_hf
    hf = tmp_path / "hf"
    make_hf_model(tie=True, arch="qwen3").save_pretrained(hf)
    run_vt("convert", "hf-to-orbax", str(hf), str(tmp_path / "ck"), "--max-position-embeddings", "4096", check=True)
    model, ref = load_model(tmp_path / "ck"), model_from_hf(hf)
    assert (model.cfg.max_position_embeddings, ref.cfg.max_position_embeddings) == (4096, 256)
    assert model.cfg.replace(max_position_embeddings=256) == ref.cfg
    a, b = flat_params(model), flat_params(ref)
    assert all(np.array_equal(a[k], b[k]) for k in b)
