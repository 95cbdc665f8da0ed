"""Hugging Face <-> vt weights: one table of rules, a shape check per rule, no key left unexplained.

HF stores PyTorch Linear weights as [out, in] with heads flattened; vt keeps einsum-friendly layouts
([in, heads, head_dim] etc., see vt/model/qwen2.py). Each `Rule` names the HF key pattern, the vt path, the
expected HF shape, and the two layout transforms. HF has one tensor per layer (`model.layers.{i}....`); vt
stacks the layers of one weight into a single array with a leading layer axis, HF layer i at index i. Reading
is lazy (safetensors memory-maps each file) and stacks one weight kind at a time; writing unstacks and goes
shard by shard, so converting a 3B model never holds it twice on the host.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from vt import VtError
from vt.checkpoint.hf_dir import SafetensorsReader, read_hf_config
from vt.checkpoint.io import atomic_output_dir, umask
from vt.checkpoint.seal import write_seal
from vt.data.tokenizer import Tokenizer, load_tokenizer, save_hf_tokenizer
from vt.distributed import is_primary
from vt.model.config import PROJECTIONS, ModelConfig, targets, to_hf_config



@dataclasses.dataclass(frozen=True)
class Rule:
    hf: str  # HF key, with {i} for the layer index in per-layer weights
    vt: tuple  # vt state path; for per-layer weights, of the stacked [num_layers, ...] array
    hf_shape: Callable[[ModelConfig], tuple]  # one HF tensor (one layer's)
    to_vt: Callable[[np.ndarray, ModelConfig], np.ndarray]  # one HF tensor -> vt layout (one layer's)
    to_hf: Callable[[np.ndarray, ModelConfig], np.ndarray]

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.hf


def _pad_rows(w, cfg):  # vocab padding rows are zeros: they never score since logits are cut to vocab_size
    return np.concatenate([w, np.zeros((cfg.padded_vocab_size - w.shape[0],) + w.shape[1:], w.dtype)])


def _qkv_rule(name, heads_of):
    return [
        Rule(f"model.layers.{{i}}.self_attn.{name}_proj.weight", ("layers", "attn", f"{name}_kernel"),
             lambda c: (heads_of(c) * c.head_dim, c.hidden_size),
             lambda w, c: w.T.reshape(c.hidden_size, heads_of(c), c.head_dim),
             lambda w, c: w.reshape(c.hidden_size, -1).T),
        Rule(f"model.layers.{{i}}.self_attn.{name}_proj.bias", ("layers", "attn", f"{name}_bias"),
             lambda c: (heads_of(c) * c.head_dim,),
             lambda w, c: w.reshape(heads_of(c), c.head_dim),
             lambda w, c: w.reshape(-1)),
    ]


def _linear_rule(hf_name, vt_path, out_dim, in_dim):
    return Rule(hf_name, vt_path, lambda c: (out_dim(c), in_dim(c)),
                lambda w, c: np.ascontiguousarray(w.T), lambda w, c: np.ascontiguousarray(w.T))


def _norm_rule(hf_name, vt_path, dim=lambda c: c.hidden_size):
    return Rule(hf_name, vt_path, lambda c: (dim(c),), lambda w, c: w, lambda w, c: w)


_D = lambda c: c.hidden_size  # noqa: E731
_F = lambda c: c.intermediate_size  # noqa: E731

RULES: list[Rule] = [
    Rule("model.embed_tokens.weight", ("embed",), lambda c: (c.vocab_size, c.hidden_size),
         _pad_rows, lambda w, c: w[: c.vocab_size]),
    Rule("lm_head.weight", ("lm_head",), lambda c: (c.vocab_size, c.hidden_size),
         lambda w, c: np.ascontiguousarray(_pad_rows(w, c).T), lambda w, c: np.ascontiguousarray(w.T[: c.vocab_size])),
    _norm_rule("model.norm.weight", ("final_norm", "weight")),
    _norm_rule("model.layers.{i}.input_layernorm.weight", ("layers", "input_norm", "weight")),
    _norm_rule("model.layers.{i}.post_attention_layernorm.weight", ("layers", "post_attn_norm", "weight")),
    *_qkv_rule("q", lambda c: c.num_heads),
    *_qkv_rule("k", lambda c: c.num_kv_heads),
    *_qkv_rule("v", lambda c: c.num_kv_heads),
    Rule("model.layers.{i}.self_attn.o_proj.weight", ("layers", "attn", "o_kernel"),
         lambda c: (c.hidden_size, c.num_heads * c.head_dim),
         lambda w, c: w.T.reshape(c.num_heads, c.head_dim, c.hidden_size),
         lambda w, c: w.reshape(-1, c.hidden_size).T),
    _norm_rule("model.layers.{i}.self_attn.q_norm.weight", ("layers", "attn", "q_norm", "weight"), lambda c: c.head_dim),
    _norm_rule("model.layers.{i}.self_attn.k_norm.weight", ("layers", "attn", "k_norm", "weight"), lambda c: c.head_dim),
    _linear_rule("model.layers.{i}.mlp.gate_proj.weight", ("layers", "mlp", "gate_kernel"), _F, _D),
    _linear_rule("model.layers.{i}.mlp.up_proj.weight", ("layers", "mlp", "up_kernel"), _F, _D),
    _linear_rule("model.layers.{i}.mlp.down_proj.weight", ("layers", "mlp", "down_kernel"), _D, _F),
]


def _rules(cfg: ModelConfig) -> list[Rule]:
    """The rules of `cfg`'s architecture: the head only when untied, q/k/v biases only for Qwen2, q/k norms only
    for Qwen3 (a tensor of the other family is then an unmatched key, an error)."""
    def applies(r: Rule) -> bool:
        if r.hf == "lm_head.weight":
            return not cfg.tie_word_embeddings
        if r.hf.endswith("_proj.bias"):
            return cfg.attention_bias
        if r.hf.endswith(("q_norm.weight", "k_norm.weight")):
            return cfg.qk_norm
        return True
    return [r for r in RULES if applies(r)]


def _hf_keys(rule: Rule, cfg: ModelConfig) -> list[str]:
    """The HF tensors of one rule: one per layer (index i = HF layer i), or the single one."""
    return [rule.hf.format(i=i) for i in range(cfg.num_layers)] if rule.per_layer else [rule.hf]


def _sort_key(hf_key: str):
    m = re.match(r"model\.layers\.(\d+)\.", hf_key)
    return (1, int(m.group(1)), hf_key) if m else (0 if "embed" in hf_key else 2, 0, hf_key)


# --- reading -----------------------------------------------------------------------------------------------------

def iter_hf_to_vt(hf_dir: Path, cfg: ModelConfig) -> Iterator[tuple[tuple, np.ndarray]]:
    """Yield (vt path, array in vt layout) one tensor at a time. Unknown, missing or misshapen keys are errors."""
    reader = SafetensorsReader(hf_dir)
    present = set(reader.keys())
    wanted = {hf for rule in _rules(cfg) for hf in _hf_keys(rule, cfg)}
    extra = sorted(present - wanted)
    if cfg.tie_word_embeddings and "lm_head.weight" in extra:
        # Some exporters write the tied head anyway; accept it only if it really is the embedding.
        if not np.array_equal(reader.get("lm_head.weight"), reader.get("model.embed_tokens.weight")):
            raise VtError(f"{hf_dir}: tensor 'lm_head.weight' differs from the embedding but config.json says "
                          "tie_word_embeddings=true")
        extra.remove("lm_head.weight")
    if extra:
        raise VtError(f"{hf_dir}: tensor '{extra[0]}' matches no conversion rule"
                      + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    missing = [hf for hf in wanted if hf not in present]
    if missing:
        raise VtError(f"{hf_dir}: tensor '{sorted(missing, key=_sort_key)[0]}' is missing"
                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for rule in _rules(cfg):
        stacked = None
        for i, hf in enumerate(_hf_keys(rule, cfg)):
            w = reader.get(hf)
            if tuple(w.shape) != rule.hf_shape(cfg):
                raise VtError(f"{reader.hf_dir / reader.key_file[hf]}: tensor '{hf}' has shape {tuple(w.shape)}, "
                              f"config.json implies {rule.hf_shape(cfg)}")
            w = rule.to_vt(w, cfg)
            if not rule.per_layer:
                yield rule.vt, w
                break
            if stacked is None:  # filled layer by layer: one stacked copy on the host, not two
                stacked = np.empty((cfg.num_layers, *w.shape), w.dtype)
            stacked[i] = w
        if stacked is not None:
            yield rule.vt, stacked


# --- writing -----------------------------------------------------------------------------------------------------

def iter_vt_to_hf(get_param: Callable[[tuple], np.ndarray], cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF key, tensor) one at a time; `get_param(vt path)` is called once per vt array, and a stacked
    array is unstacked into its layers."""
    for rule in _rules(cfg):
        where = "/".join(map(str, rule.vt))
        w_all = np.asarray(get_param(rule.vt))
        if rule.per_layer and (w_all.ndim == 0 or w_all.shape[0] != cfg.num_layers):
            raise VtError(f"vt parameter {where}: shape {w_all.shape} has no leading layer axis of "
                          f"num_layers={cfg.num_layers}")
        for i, hf in enumerate(_hf_keys(rule, cfg)):
            w = rule.to_hf(w_all[i] if rule.per_layer else w_all, cfg)
            if tuple(w.shape) != rule.hf_shape(cfg):  # a vt-side layout bug must not produce a loadable lie
                raise VtError(f"vt parameter {where}: exported shape {w.shape} != {rule.hf_shape(cfg)}")
            yield hf, w


def write_hf_dir(out_dir: Path, cfg: ModelConfig, tensors: Iterator[tuple[str, np.ndarray]], *,
                 dtype: str = "float32", tokenizer: Path | str | Tokenizer | None = None,
                 max_shard_bytes: int = 2 << 30) -> None:
    """Write config.json, generation_config.json, sharded safetensors + index, and the tokenizer: a Hugging Face
    model directory as `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained` load it.

    `tokenizer`: an HF tokenizer directory or a SentencePiece `.model` (or a loaded vt Tokenizer), written as HF
    tokenizer files (vt.data.tokenizer.save_hf_tokenizer: same ids, chat template, specials); its end-of-turn and
    pad ids go into config.json and generation_config.json, so `generate` stops at the end of a turn. None writes
    weights only (the CLI asks for --no-tokenizer to say so).

    Shards are flushed as soon as they fill, so peak host memory is one shard plus one tensor. The directory
    appears only when complete (written under a temporary name, then renamed), sealed over every file, with the
    permissions the umask gives. Multi-process: every process consumes `tensors` (gathering is collective) but
    only process 0 writes files."""
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}.get(dtype)
    if np_dtype is None:
        raise VtError(f"--dtype {dtype!r}: expected float32, bfloat16 or float16")
    tok = tokenizer if tokenizer is None or isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    if tok is not None and tok.vocab_size > cfg.vocab_size:
        raise VtError(f"{tok.path}: the tokenizer has {tok.vocab_size} tokens, more than the model's vocab_size "
                      f"{cfg.vocab_size}: not this model's tokenizer")

    with atomic_output_dir(out_dir) as tmp:
        shards: list[list[str]] = []
        weight_map: dict[str, str] = {}
        pending: dict[str, np.ndarray] = {}
        pending_bytes, total_bytes = 0, 0

        def flush():
            nonlocal pending, pending_bytes
            if pending:
                name = f"model-{len(shards) + 1:05d}.safetensors"
                if is_primary():
                    save_file(pending, str(tmp / name), metadata={"format": "pt"})
                shards.append(list(pending))
                pending, pending_bytes = {}, 0

        for key, w in tensors:
            w = np.ascontiguousarray(w.astype(np_dtype))
            if pending and pending_bytes + w.nbytes > max_shard_bytes:
                flush()
            pending[key] = w
            pending_bytes += w.nbytes
            total_bytes += w.nbytes
        flush()
        if not is_primary():
            return
        # Rename shards to the HF convention model-0000k-of-0000n once n is known.
        for k, keys in enumerate(shards, start=1):
            final = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            os.rename(tmp / f"model-{k:05d}.safetensors", tmp / final)
            weight_map.update({key: final for key in keys})
        index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items(), key=lambda kv: _sort_key(kv[0])))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        ids = generation_ids(cfg, tok)
        hf_config = to_hf_config(cfg, torch_dtype=dtype)
        if tok is not None:  # one end-of-turn id, as Qwen2.5-Instruct's config.json
            hf_config.update(eos_token_id=ids["eos_token_id"][0], pad_token_id=ids["pad_token_id"])
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        gen = {**{k: v for k, v in ids.items() if v is not None}, "do_sample": True, "temperature": 1.0,
               "top_p": 0.95, "top_k": 0}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        if tok is not None:
            save_hf_tokenizer(tok, tmp)
        apply_umask(tmp)
        write_seal(tmp)  # last, over every file: readers of vt's exports verify it (vt.checkpoint.seal)


def generation_ids(cfg: ModelConfig, tok: Tokenizer | None) -> dict:
    """bos / eos / pad ids for config.json and generation_config.json. With a tokenizer: eos is the end of a turn
    (config.json, as Qwen2.5-Instruct's) and, for generation, every stop token vt's sampler stops on (end of turn
    and end of text); pad is the tokenizer's. Without one: what the model config holds (Qwen2.5's <|im_end|>
    where the vocabulary is Qwen's)."""
    if tok is None:
        eos = [t for t in (cfg.eos_token_id, 151645 if cfg.vocab_size > 151645 else None) if t is not None]
        return {"bos_token_id": cfg.bos_token_id, "eos_token_id": eos or None, "pad_token_id": None}
    turn_end = tok.token_to_id("<|im_end|>")
    turn_end = turn_end if turn_end is not None else tok.eos_token_ids[0]
    return {"bos_token_id": cfg.bos_token_id, "eos_token_id": [turn_end, *(i for i in tok.eos_token_ids if i != turn_end)],
            "pad_token_id": tok.pad_token_id}


def apply_umask(root: Path) -> None:
    """Give `root` and everything under it the permissions a plain mkdir / open would (0755 / 0644 under the usual
    umask 022): the temporary directory an atomic output starts as is 0700."""
    mask = umask()
    os.chmod(root, 0o777 & ~mask)
    for d, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(Path(d) / name, 0o777 & ~mask)
        for name in files:
            os.chmod(Path(d) / name, 0o666 & ~mask)


# --- PEFT LoRA adapters --------------------------------------------------------------------------------------------

# vt projection -> the HF module path under a decoder layer (vt.model.config.PROJECTIONS names the projections)
_PEFT_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                 "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def peft_adapter_tensors(cfg: ModelConfig, adapters: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """vt's stacked adapters ("layers.attn.q_lora_a" [L, in..., r], "..._lora_b" [L, r, out...]) as PEFT's
    per-layer torch Linear factors: lora_A.weight [r, in], lora_B.weight [out, in -> r] (heads flattened as the
    HF projections flatten them)."""
    out = {}
    for name in targets(cfg.lora_targets):
        module_name, _ = PROJECTIONS[name]
        a_all, b_all = adapters[f"layers.{module_name}.{name}_lora_a"], adapters[f"layers.{module_name}.{name}_lora_b"]
        r = cfg.lora_rank
        for i in range(cfg.num_layers):
            prefix = f"base_model.model.model.layers.{i}.{_PEFT_MODULES[name]}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(np.asarray(a_all[i], np.float32).reshape(-1, r).T)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(np.asarray(b_all[i], np.float32).reshape(r, -1).T)
    return out


def write_peft_adapter(out_dir: Path, cfg: ModelConfig, adapters: dict[str, np.ndarray], *, base_model: str) -> None:
    """adapter_config.json and adapter_model.safetensors (float32) of a LoRA model, into an existing `out_dir`
    (process 0 writes; the caller seals)."""
    tensors = peft_adapter_tensors(cfg, adapters)
    if not is_primary():
        return
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": cfg.lora_rank, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
              "target_modules": [_PEFT_MODULES[n].split(".")[-1] for n in targets(cfg.lora_targets)],
              "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
              "init_lora_weights": True, "modules_to_save": None, "inference_mode": True}
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    apply_umask(out_dir)
    write_seal(out_dir)
