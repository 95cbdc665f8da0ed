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
from vt.model.qwen2 import create_model
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
    """Measured when written: held-out loss 6.24 at step 20 -> 2.6 at step 150 (full fine-tuning reaches < 1.2
    in 300 steps; the random-init base with frozen embeddings learns slower through rank-8 adapters)."""
    cfg = _cfg("--config.train.steps=150", "--config.train.eval_every=20", "--config.checkpoint.every=1000",
               "--config.data.eval_batches=2", "--config.optim.lr=1e-2", "--config.optim.final_lr=1e-3")
    train(cfg, tmp_path)
    evals = [m["eval_loss"] for m in _metrics(tmp_path) if "eval_loss" in m]
    print(f"LoRA SFT held-out loss: {evals}")
    assert evals[-1] < evals[0] - 1.0, evals
    start = flat_params(create_model(load_model(tmp_path / "checkpoints" / "150").cfg, seed=cfg.model.seed))
    end = flat_params(load_model(tmp_path / "checkpoints" / "150"))
    assert set(start) == set(end)
    for k in start:
        if lora.is_adapter(k):
            if k.endswith("_lora_b"):
                assert np.abs(np.asarray(end[k])).max() > 0, k  # trained away from zero
        else:
            assert np.array_equal(np.asarray(start[k]), np.asarray(end[k])), k  # bitwise unchanged


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
