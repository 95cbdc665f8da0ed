"""The tiny smoke recipe on the Qwen3-shaped twin (preset "tiny-qwen3": head_dim 24 != 96 / 6 heads, no q/k/v bias,
q/k norms): SFT teaches the task from a random init, MGPO raises held-out accuracy as it does for the Qwen2-shaped
tiny model (tests/rl/test_learner.py), and the result exports to a directory transformers loads as Qwen3ForCausalLM
with the same logits."""
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))
from rl_helpers import build_task, rl_config  # noqa: E402
from testutil import run_vt  # noqa: E402

from vt.checkpoint.params import load_model  # noqa: E402
from vt.rl.learner import train_rl  # noqa: E402

FP32_TOL = 1e-5  # as tests/model/test_parity.py


def test_qwen3_twin_sft_rl_and_export(tmp_path):
    task = build_task(tmp_path / "task", preset="tiny-qwen3")
    assert load_model(task["ckpt"]).cfg.qk_norm
    result = train_rl(rl_config(task, **{"train.steps": 20}), tmp_path / "mgpo")
    (s0, before), (s1, after) = result.eval_history[0], result.eval_history[-1]
    assert s0 == 0 and s1 == 20
    assert before >= 0.1, result.eval_history  # SFT from a random init learned the task (random: ~0)
    assert after >= before + 0.15, result.eval_history

    from transformers import AutoModelForCausalLM
    final = tmp_path / "mgpo" / "checkpoints" / "final"
    ckpt = final if final.is_dir() else sorted((tmp_path / "mgpo" / "checkpoints").glob("[0-9]*"),
                                               key=lambda p: int(p.name))[-1]
    run_vt("convert", "orbax-to-hf", str(ckpt), str(tmp_path / "hf"), "--no-tokenizer", check=True)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokens = np.random.RandomState(0).randint(0, 300, (2, 13))
    with torch.no_grad():
        ref = hf(torch.tensor(tokens)).logits.numpy()
    ours = np.asarray(load_model(ckpt)(tokens)[0])
    assert np.abs(ref - ours).max() < FP32_TOL
