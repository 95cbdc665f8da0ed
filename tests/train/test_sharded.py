"""Training on 8 simulated CPU devices (data 2 x fsdp 2 x tensor 2) follows the single-device loss curve."""
import json

import pytest

from testutil import run_vt
from vt.checkpoint.params import load_model
from vt.config import load_config, to_dataclass
from vt.sharding import make_mesh
from vt.train.sft import SftConfig, train
from vt.train.state import ModelDef

TOLERANCE = 2e-4  # relative, per step: fp32 with different reduction orders over 6 steps at lr 3e-3
CONFIG = "configs/sft_stage1.py:smoke"
OVERRIDES = ["--config.train.steps=6", "--config.checkpoint.every=100", "--config.train.progress=False",
             "--config.train.eval_every=0", "--config.data.global_batch_size=8", "--config.data.grad_accum_steps=2"]


def _losses(workdir):
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(m["loss"], m["grad_norm"], m["batch_hash"]) for m in lines]


@pytest.mark.devices(8)
def test_sharded_training_matches_single_device(tmp_path):
    cfg = to_dataclass(SftConfig, load_config(CONFIG, OVERRIDES + ["--config.mesh.data=2", "--config.mesh.fsdp=2",
                                                                  "--config.mesh.tensor=2"]))
    train(cfg, tmp_path / "eight")
    spec = ModelDef(load_model(tmp_path / "eight" / "checkpoints" / "6").cfg).param_shardings(make_mesh(cfg.mesh))
    assert {"fsdp", "tensor"} <= set(spec["layers.mlp.up_kernel"].spec), spec["layers.mlp.up_kernel"]
    # the single-device run: a `vt train` process of its own (this one has 8 devices)
    run_vt("train", "--config", CONFIG, "--workdir", str(tmp_path / "one"), *OVERRIDES, "--config.mesh.fsdp=1",
           check=True, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "eight")
    assert len(a) == len(b) == 6
    for step, ((la, ga, ha), (lb, gb, hb)) in enumerate(zip(a, b), 1):
        assert ha == hb, f"step {step}: different batches"
        assert abs(la - lb) <= TOLERANCE * abs(la), f"step {step}: loss {la} vs {lb}"
        assert abs(ga - gb) <= 10 * TOLERANCE * abs(ga), f"step {step}: grad norm {ga} vs {gb}"
    print("single-device vs 8-device losses:", [(round(x[0], 6), round(y[0], 6)) for x, y in zip(a, b)])
