"""LoRA SFT runs (model.lora_rank > 0): only the adapters change (the base weights bitwise as they started),
gradients and AdamW state exist for the adapters alone, the synthetic task's held-out loss falls, a resumed
run equals a straight one bitwise."""
import json
from pathlib import Path

import jax
import numpy as np

from vt.checkpoint.params import flat_params, load_model
from vt.config import load_config, to_dataclass
from vt.model import lora
from vt.model.config import preset
from vt.train.sft import SftConfig, train

REPO = Path(__file__).resolve().parents[2]
LORA = ["--config.model.lora_rank=8", "--config.model.lora_alpha=16.0", "--config.train.progress=False"]


def _cfg(*overrides):
    return to_dataclass(SftConfig, load_config(str(REPO / "configs/sft_stage1.py:smoke"), [*LORA, *overrides]))


def _metrics(workdir):
    return [json.loads(x) for x in (Path(workdir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_optimizer_state_and_gradients_cover_the_adapters_only():
    from vt.sharding import MeshConfig, make_mesh
    from vt.train.optim import OptimConfig, make_optimizer
    from vt.train.state import ModelDef, train_state_shardings, abstract_train_state
    cfg = preset("tiny").replace(lora_rank=8)
    md = ModelDef(cfg)
    optimizer, _ = make_optimizer(OptimConfig(), 10)
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    abstract = abstract_train_state(md, optimizer, train_state_shardings(md, optimizer, mesh))
    adapter_elems = sum(int(np.prod(v.shape)) for k, v in abstract.params.items() if lora.is_adapter(k))
    moment_elems = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.opt_state) if x.ndim)
    assert moment_elems == 2 * adapter_elems  # AdamW's mu and nu, of the adapters only


def test_lora_sft_lowers_heldout_loss_and_changes_only_the_adapters(tmp_path):
    """A base briefly fully fine-tuned on the synthetic task (a random-init tiny model's frozen 0.02-scale tied
    embeddings and unit final norm cap its logit range near 2, so LoRA on a raw random base cannot fit any
    task), then LoRA from its checkpoint: the held-out loss keeps falling, and only the adapters change."""
    base = _cfg("--config.model.lora_rank=0", "--config.train.steps=60", "--config.checkpoint.every=60")
    train(base, tmp_path / "base")
    init = tmp_path / "base" / "checkpoints" / "60"
    cfg = _cfg(f"--config.model.init_checkpoint={init}", "--config.train.steps=60", "--config.train.eval_every=20",
               "--config.checkpoint.every=1000", "--config.optim.lr=5e-3", "--config.optim.final_lr=5e-4")
    train(cfg, tmp_path / "lora")
    evals = [m["eval_loss"] for m in _metrics(tmp_path / "lora") if "eval_loss" in m]
    start_loss = [m["eval_loss"] for m in _metrics(tmp_path / "base") if "eval_loss" in m][-1]
    print(f"LoRA SFT held-out loss: base {start_loss:.3f} -> {[round(e, 3) for e in evals]}")
    # Measured (lr 5e-3, cosine to 5e-4): 3.310 -> [3.225, 3.155, 3.109] on jax 0.10.2 and 3.292 -> [3.216, 3.125,
    # 3.083] on jax 0.12.0.1 (full fine-tuning of the same base falls by about as much over its last 30 steps); asked
    # for: falling at every evaluation and by 0.15 in all. At lr 1e-2 the first evaluation rose on jax 0.12 (3.323).
    assert all(b < a for a, b in zip([start_loss, *evals], evals)) and evals[-1] < start_loss - 0.15, (start_loss, evals)
    start = flat_params(load_model(init))
    end = flat_params(load_model(tmp_path / "lora" / "checkpoints" / "60"))
    assert set(end) - set(start) == {k for k in end if lora.is_adapter(k)}
    for k in start:  # the base bitwise as it started
        assert np.array_equal(np.asarray(start[k]), np.asarray(end[k])), k
    assert all(np.abs(np.asarray(end[k])).max() > 0 for k in end if k.endswith("_lora_b"))  # trained from 0


def test_lora_sft_resume_is_exact(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    over = ("--config.checkpoint.every=2", "--config.optim.lr=1e-2", "--config.model.lora_dropout=0.1",
            "--config.data.grad_accum_steps=2")
    train(_cfg("--config.train.steps=4", *over), straight)
    train(_cfg("--config.train.steps=2", *over), resumed)
    train(_cfg("--config.train.steps=4", *over), resumed)
    a, b = _metrics(straight), _metrics(resumed)
    assert [m["loss"] for m in a] == [m["loss"] for m in b]
    pa = flat_params(load_model(straight / "checkpoints" / "4"))
    pb = flat_params(load_model(resumed / "checkpoints" / "4"))
    for k in pa:
        assert np.array_equal(np.asarray(pa[k]), np.asarray(pb[k])), k


def test_lora_train_state_is_at_most_a_quarter_of_full_fine_tuning():
    """bench/compile.py's state_bytes (params + AdamW state + gradients, from abstract shapes: nothing allocated)
    at real size, rank 64 on every projection with the frozen base in bf16. Measured when written: coder-3b
    8.09 / 49.38 GB (16.4%), 7B 17.81 / 121.85 GB (14.6%)."""
    import sys
    sys.path.insert(0, str(REPO / "bench"))
    from compile import state_bytes
    from vt.sharding import MeshConfig, make_mesh
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    for name in ("qwen2.5-coder-3b", "qwen2.5-7b"):
        full = state_bytes(preset(name, param_dtype="float32"), mesh)
        lora_bytes = state_bytes(preset(name, param_dtype="bfloat16", lora_rank=64, lora_alpha=128.0), mesh)
        assert lora_bytes <= 0.25 * full, (name, lora_bytes, full)
