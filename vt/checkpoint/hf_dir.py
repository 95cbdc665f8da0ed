"""A Hugging Face model directory, read: config.json as a ModelConfig and its safetensors tensors, lazily.

Imports no JAX, so `vt info` describes a directory without starting it (vt.checkpoint.hf converts the tensors).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from vt import VtError
from vt.model.config import ModelConfig, from_hf_config


def read_hf_config(hf_dir: Path, **overrides) -> ModelConfig:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise VtError(f"{path}: no such file (is {hf_dir} a Hugging Face model directory?)")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VtError(f"{path}: not valid JSON ({e})") from None
    return from_hf_config(raw, source=str(path), **overrides)


class SafetensorsReader:
    """Lazy access to the tensors of an HF directory: single `model.safetensors` or a sharded index."""

    def __init__(self, hf_dir: Path):
        self.hf_dir = Path(hf_dir)
        index = self.hf_dir / "model.safetensors.index.json"
        single = self.hf_dir / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise VtError(f"{index}: not a safetensors index (field 'weight_map': {e})") from None
        elif single.is_file():
            weight_map = None
        else:
            raise VtError(f"{self.hf_dir}: no model.safetensors or model.safetensors.index.json")
        files = sorted(set(weight_map.values())) if weight_map else [single.name]
        self._handles, self.key_file = {}, {}
        for name in files:
            path = self.hf_dir / name
            if not path.is_file():
                raise VtError(f"{path}: listed in the safetensors index but missing")
            try:
                handle = safe_open(str(path), framework="np")
                keys = list(handle.keys())
            except (SafetensorError, OSError, ValueError) as e:
                raise VtError(f"{path}: corrupted or unreadable safetensors file ({e})") from None
            self._handles[name] = handle
            for k in keys:
                self.key_file[k] = name
        if weight_map:
            for k, name in weight_map.items():
                if self.key_file.get(k) != name:
                    raise VtError(f"{self.hf_dir / name}: index lists tensor '{k}' but the file does not hold it")

    def keys(self) -> list[str]:
        return list(self.key_file)

    def get(self, key: str) -> np.ndarray:
        path = self.hf_dir / self.key_file[key]
        try:
            return self._handles[self.key_file[key]].get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise VtError(f"{path}: tensor '{key}' is unreadable ({e})") from None
