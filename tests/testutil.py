"""Shared test helpers: tiny random-weight transformers Qwen2 checkpoints built on the spot (no downloads)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Odd sizes on purpose (issue 2): 3 layers, hidden 96, 6 query heads, 2 KV heads.
TINY_HF = dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
               num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6)


def make_hf_model(tie: bool, seed: int = 0, **overrides):
    """transformers Qwen2ForCausalLM with random weights, non-zero biases and non-unit norms (so a dropped
    bias or a norm applied as (1 + w) cannot pass unnoticed)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(**{**TINY_HF, **overrides}, tie_word_embeddings=tie)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
    return model


def run_vt(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "vt", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"vt {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def run_multidevice(code: str, devices: int = 8, timeout: int = 600) -> str:
    """Run `code` in a fresh interpreter with `devices` simulated CPU devices (this process already initialised
    JAX with one). Returns stdout; raises with stderr on failure."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"multi-device subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """A tmpfs of `size` ("32k", "5m") mounted at `path` for the block: a disk that really fills (ENOSPC from the
    kernel, for every writer and thread). Needs root (CI runs as root); skips the test otherwise."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip() or 'not root'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def fill_disk(directory: Path) -> None:
    """Write zeros into `directory` until its file system refuses more."""
    with open(directory / "filler", "wb", buffering=0) as f:  # unbuffered: closing has nothing left to write
        try:
            while f.write(b"\0" * (1 << 16)):
                pass
        except OSError:
            pass
