"""Training on 8 simulated CPU devices (data 2 x fsdp 2 x tensor 2) follows the single-device loss curve."""
import json

from testutil import run_multidevice

TOLERANCE = 2e-4  # relative, per step: fp32 with different reduction orders over 6 steps at lr 3e-3

RUN = """
    import json, jax
    from vt.config import load_config, to_dataclass
    from vt.train.sft import SftConfig, train
    overrides = ["--config.train.steps=6", "--config.checkpoint.every=100", "--config.train.progress=False",
                 "--config.train.eval_every=0", "--config.data.global_batch_size=8", "--config.data.grad_accum_steps=2"]
    overrides += {mesh}
    cfg = to_dataclass(SftConfig, load_config("configs/sft_stage1.py:smoke", overrides))
    train(cfg, "{workdir}")
    if jax.device_count() == 8:
        from vt.checkpoint.params import load_model
        m = load_model("{workdir}/checkpoints/6")
        from vt.train.state import ModelDef
        from vt.sharding import make_mesh
        sh = ModelDef(m.cfg).param_shardings(make_mesh(cfg.mesh))
        print("SPECS", json.dumps({{k: str(v.spec) for k, v in sh.items() if k.startswith("layers.")}}))
    print("DEVICES", jax.device_count())
"""


def _losses(workdir):
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [(m["loss"], m["grad_norm"], m["batch_hash"]) for m in lines]


def test_sharded_training_matches_single_device(tmp_path):
    one = run_multidevice(RUN.format(mesh='["--config.mesh.fsdp=1"]', workdir=tmp_path / "one"), devices=1)
    eight = run_multidevice(RUN.format(mesh='["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]',
                                       workdir=tmp_path / "eight"), devices=8)
    assert "DEVICES 1" in one and "DEVICES 8" in eight
    specs = json.loads(eight.split("SPECS ")[1].splitlines()[0])
    assert "fsdp" in specs["layers.mlp.up_kernel"] and "tensor" in specs["layers.mlp.up_kernel"]
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "eight")
    assert len(a) == len(b) == 6
    for step, ((la, ga, ha), (lb, gb, hb)) in enumerate(zip(a, b), 1):
        assert ha == hb, f"step {step}: different batches"
        assert abs(la - lb) <= TOLERANCE * abs(la), f"step {step}: loss {la} vs {lb}"
        assert abs(ga - gb) <= 10 * TOLERANCE * abs(ga), f"step {step}: grad norm {ga} vs {gb}"
    print("single-device vs 8-device losses:", [(round(x[0], 6), round(y[0], 6)) for x, y in zip(a, b)])
