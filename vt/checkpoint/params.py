"""Model-parameter checkpoints in Orbax format, and conversion to and from Hugging Face.

A vt model checkpoint is a directory holding
    model_config.json   the ModelConfig (architecture + dtypes)
    params/             an Orbax PyTree checkpoint: a flat dict "layers.attn.q_kernel" -> array, the decoder
                        layers' weights stacked along a leading layer axis ([num_layers, ...])
The learners' checkpoint manager writes the same two entries inside each step directory, so every tool that
takes a checkpoint (`vt sample --ckpt`, `vt convert orbax-to-hf`, `vt info`) accepts either.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from vt import VtError
from vt.checkpoint.hf import iter_hf_to_vt, iter_vt_to_hf, write_hf_dir, write_peft_adapter
from vt.checkpoint.hf_dir import read_hf_config
from vt.checkpoint.io import atomic_output_dir, reader_error
from vt.checkpoint.seal import BackgroundVerify, write_seal
from vt.distributed import is_primary
from vt.model import lora
from vt.model.qwen2 import Qwen2, abstract_model
from vt.model.config import ModelConfig
from vt.sharding import state_shardings

CONFIG_FILE = "model_config.json"
PARAMS_ITEM = "params"


def path_key(path: tuple) -> str:
    return ".".join(map(str, path))


def flat_params(model_or_state) -> dict[str, jax.Array]:
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state, nnx.Param)
    return {path_key(p): v.get_value() for p, v in nnx.to_flat_state(state)}


def _checkpointer():
    return ocp.PyTreeCheckpointer()


def _item_metadata(params_dir: Path):
    """The params item's tree metadata, read through Orbax's item handler rather than `Checkpointer.metadata`:
    that one treats its directory as a whole step and first reads the step's _CHECKPOINT_METADATA, which a
    learner's step/params item does not have (the manager writes it one level up), so every load of a learner
    checkpoint logged 'WARNING:absl:Metadata file does not exist'. The restore itself reads no step metadata."""
    return ocp.PyTreeCheckpointHandler().metadata(params_dir)


def save_model(ckpt_dir: Path | str, model: Qwen2, *, overwrite: bool = False) -> Path:
    """Write a model checkpoint atomically (the directory appears only when complete)."""
    ckpt_dir = Path(ckpt_dir).absolute()
    with atomic_output_dir(ckpt_dir, overwrite=overwrite) as tmp:
        write_model_entries(tmp, model.cfg, flat_params(model))
    return ckpt_dir


def write_model_entries(directory: Path, cfg: ModelConfig, params: dict[str, jax.Array]) -> None:
    # Orbax accepts only absolute paths (`vt merge --out rel` crashed on that); collective: every process writes.
    _checkpointer().save(Path(directory).absolute() / PARAMS_ITEM, params)
    if is_primary():
        (Path(directory) / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
        write_seal(directory)  # last: every reader verifies it (vt.checkpoint.seal)


def load_model_config(ckpt_dir: Path | str, **overrides) -> ModelConfig:
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / CONFIG_FILE
    if not path.is_file():
        if not ckpt_dir.exists():
            raise VtError(f"{ckpt_dir}: no such checkpoint directory")
        raise VtError(f"{path}: missing; {ckpt_dir} is not a vt checkpoint "
                      "(for a Hugging Face directory run `vt convert hf-to-orbax` first)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VtError(f"{path}: not valid JSON ({e})") from None
    raw.update(overrides)
    return ModelConfig.from_dict(raw, source=str(path))


def load_model(ckpt_dir: Path | str, mesh: Mesh | None = None, **config_overrides) -> Qwen2:
    """Restore a checkpoint straight into its sharding on `mesh` (or the default device).

    `config_overrides` may change dtypes, attention implementation or remat policy; stored arrays are cast to
    `param_dtype` on restore."""
    ckpt_dir = Path(ckpt_dir).absolute()
    cfg = load_model_config(ckpt_dir, **config_overrides)
    graphdef, abstract_state = nnx.split(abstract_model(cfg))
    shardings = _flat_shardings(abstract_state, mesh)
    target = {key: jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype, sharding=shardings[key])
              for key, v in _flat(abstract_state).items()}
    params_dir = ckpt_dir / PARAMS_ITEM
    if not params_dir.is_dir():
        raise VtError(f"{params_dir}: missing; {ckpt_dir} holds no parameters")
    verification = BackgroundVerify(ckpt_dir, f"checkpoint {ckpt_dir}")  # hashes while Orbax reads the files
    try:
        stored = stored_param_metadata(params_dir)
    except VtError:
        verification.result()  # a damaged file: the seal names it
        raise
    _check_keys(set(stored.keys()), set(target), params_dir, cfg, stored)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    try:
        restored = _checkpointer().restore(params_dir, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))
    except Exception as e:  # orbax/tensorstore raise many types; surface the path and the cause
        verification.result()
        raise VtError(f"{params_dir}: cannot restore ({reader_error(e)})") from None
    verification.result()
    return _merge(graphdef, abstract_state, restored)


def stored_param_metadata(params_dir: Path) -> dict:
    """Tensor name -> stored metadata (shape, dtype) of a checkpoint's params item, read without the weights;
    VtError when the item's metadata is missing or unreadable (Orbax itself returns None for that)."""
    params_dir = Path(params_dir).absolute()
    if params_dir.is_dir() and not (params_dir / "_METADATA").is_file():
        stored = None  # Orbax's item handler raises a page about it; name it as an empty one is named below
    else:
        try:
            stored = _item_metadata(params_dir)
        except Exception as e:  # orbax/tensorstore raise many types; surface the path and the cause
            raise VtError(f"{params_dir}: unreadable checkpoint metadata ({reader_error(e)})") from None
    stored = getattr(stored, "tree", stored)
    if not isinstance(stored, dict) or not stored:
        raise VtError(f"{params_dir}: no parameter metadata (_METADATA missing or empty); "
                      "the checkpoint is incomplete or damaged")
    return stored


def _flat(state) -> dict:
    return {path_key(p): v for p, v in nnx.to_flat_state(state)}


def _flat_shardings(abstract_state, mesh: Mesh | None) -> dict:
    if mesh is None:
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return {key: one for key in _flat(abstract_state)}
    return _flat(state_shardings(abstract_state, mesh))


def _check_keys(stored_keys, wanted_keys, where, cfg, stored_meta):
    missing = sorted(wanted_keys - stored_keys)
    extra = sorted(stored_keys - wanted_keys)
    if any(re.match(r"layers\.\d+\.", k) for k in extra):
        raise VtError(f"{where}: written by an older vt with one entry per layer ('{extra[0]}'); this vt stores "
                      "the layers stacked ('layers.attn.q_kernel' [num_layers, ...]) and cannot read it: convert "
                      "the model again from Hugging Face (`vt convert hf-to-orbax`)")
    if missing or extra:
        raise VtError(f"{where}: parameters do not match {CONFIG_FILE} "
                      f"(missing {missing[:3]}, unexpected {extra[:3]})")


def _merge(graphdef, abstract_state, flat: dict[str, jax.Array]) -> Qwen2:
    def pick(path, var):
        return var.replace(flat[path_key(path)])
    return nnx.merge(graphdef, nnx.map_state(pick, abstract_state))


# --- Hugging Face ------------------------------------------------------------------------------------------------

def model_from_hf(hf_dir: Path | str, mesh: Mesh | None = None, **config_overrides) -> Qwen2:
    """Build a vt model from an HF directory, placing each tensor into its sharding as it is read."""
    cfg = read_hf_config(Path(hf_dir), **config_overrides)
    graphdef, abstract_state = nnx.split(abstract_model(cfg))
    shardings = _flat_shardings(abstract_state, mesh)
    specs = _flat(abstract_state)
    flat = {}
    # A directory vt exported carries a seal; one from elsewhere (the Hub) does not and is read as it is.
    verification = BackgroundVerify(Path(hf_dir), f"Hugging Face directory {hf_dir}", required=False)
    for path, w in iter_hf_to_vt(Path(hf_dir), cfg):
        key = path_key(path)
        want = specs[key].get_value()
        if tuple(w.shape) != tuple(want.shape):  # a layout bug in the rule table, not bad input
            raise VtError(f"vt parameter {key}: converted shape {tuple(w.shape)} != model shape {tuple(want.shape)}")
        w = np.asarray(w).astype(want.dtype, copy=False)
        flat[key] = jax.make_array_from_callback(w.shape, shardings[key], lambda idx, w=w: w[idx])
    verification.result()
    return _merge(graphdef, abstract_state, flat)


def import_from_hf(hf_dir: Path | str, ckpt_dir: Path | str, *, param_dtype: str | None = None,
                   max_position_embeddings: int | None = None, progress: Callable | None = None) -> ModelConfig:
    """`vt convert hf-to-orbax`: HF directory -> vt checkpoint directory. `max_position_embeddings` replaces
    config.json's context length (the weights are unchanged; rope_theta too): a base whose config states a short
    context (Qwen2.5-Math-1.5B: 4,096) is fine-tuned to longer rows, and vt's sampler and RL learner bound their
    windows by this field."""
    overrides = {"param_dtype": param_dtype} if param_dtype else {}
    if max_position_embeddings is not None:
        overrides["max_position_embeddings"] = max_position_embeddings
    model = model_from_hf(hf_dir, **overrides)
    save_model(ckpt_dir, model)
    return model.cfg


def _gather(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:  # multi-host: every process holds a piece; assemble this one tensor only
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def merge_adapters(model: Qwen2) -> Qwen2:
    """A LoRA model (cfg.lora_rank) as the plain model it computes: each adapted kernel W + (alpha / r) A B
    (vt.model.lora.merged_params, on device, in each kernel's sharding). A model without adapters as it is."""
    if not model.cfg.lora_rank:
        return model
    cfg = lora.base_config(model.cfg)
    graphdef, abstract_state = nnx.split(abstract_model(cfg))
    merged = jax.jit(lambda p: lora.merged_params(p, model.cfg))(flat_params(model))
    return _merge(graphdef, abstract_state, merged)


def export_to_hf(model: Qwen2, hf_dir: Path | str, *, dtype: str | None = None, tokenizer: Path | str | None = None,
                 max_shard_bytes: int = 2 << 30, tokenizer_dir: Path | str | None = None) -> None:
    """Write `model` as an HF directory, one tensor at a time (no second full copy on the host). A LoRA model
    is written merged (`merge_adapters`); `export_peft` writes its adapters for PEFT instead.

    `dtype` None keeps the model's `param_dtype`, so an export loses no precision unless a narrower dtype is
    asked for. `tokenizer` (an HF tokenizer directory or a SentencePiece `.model`; `tokenizer_dir` is its old
    name) is written as HF tokenizer files with its eos / pad ids (vt.checkpoint.hf.write_hf_dir)."""
    tokenizer = tokenizer or tokenizer_dir
    model = merge_adapters(model)
    flat = flat_params(model)
    write_hf_dir(Path(hf_dir), model.cfg, iter_vt_to_hf(lambda path: _gather(flat[path_key(path)]), model.cfg),
                 dtype=dtype or model.cfg.param_dtype, tokenizer=tokenizer or None, max_shard_bytes=max_shard_bytes)


def export_peft(model: Qwen2, out_dir: Path | str, *, dtype: str | None = None,
                tokenizer: Path | str | None = None, max_shard_bytes: int = 2 << 30) -> None:
    """`vt convert orbax-to-hf --lora-format peft`: a LoRA model as a PEFT adapter directory (adapter_config.json,
    adapter_model.safetensors, float32) holding its frozen base model as an HF directory in `base_model/`, which
    adapter_config.json names (`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(OUT/base_model),
    OUT)`)."""
    if not model.cfg.lora_rank:
        raise VtError("--lora-format peft: the checkpoint has no LoRA adapters (model_config.json lora_rank is 0)")
    out_dir = Path(out_dir).absolute()
    flat = flat_params(model)
    base_cfg = lora.base_config(model.cfg)
    base = {k: v for k, v in flat.items() if not lora.is_adapter(k)}
    with atomic_output_dir(out_dir) as tmp:
        write_hf_dir(tmp / "base_model", base_cfg, iter_vt_to_hf(lambda path: _gather(base[path_key(path)]), base_cfg),
                     dtype=dtype or model.cfg.param_dtype, tokenizer=tokenizer or None, max_shard_bytes=max_shard_bytes)
        write_peft_adapter(tmp, model.cfg, {k: _gather(v) for k, v in flat.items() if lora.is_adapter(k)},
                           base_model=str(out_dir / "base_model"))
