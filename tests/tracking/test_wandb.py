"""W&B beside TensorBoard (vt.tracking), offline: a tiny SFT and RL job log the same scalars to both (same keys,
same values per step), a restarted job continues the same W&B run, eval and pipeline stages get one run each."""
import json
from pathlib import Path

import numpy as np
import pytest

from vt import VtError
from vt.config import load_config, to_dataclass
from vt.rl.learner import RLConfig, train_rl
from vt.tracking import LoggingConfig
from vt.tracking.wandb import RUN_ID_FILE, log_summary
from vt.train.sft import SftConfig, train

pytest.importorskip("wandb")
from testutil import tensorboard_scalars, wandb_runs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
W = ["--config.logging.wandb_project=vt-test", "--config.logging.wandb_tags=('tiny', 'ci')"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network here
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # not the user's ~/.config/wandb


def assert_same_scalars(workdir: Path, runs: list[dict]) -> dict:
    """W&B's history (all the runs' pieces) and TensorBoard's scalars: the same steps, keys and values (TensorBoard
    stores float32: W&B's float64 value, rounded to float32, must equal it exactly)."""
    history: dict[int, dict] = {}
    for run in runs:
        for step, items in run["history"].items():
            history.setdefault(step, {}).update(items)
    tb = tensorboard_scalars(workdir / "tb")
    assert sorted(history) == sorted(tb)
    for step in tb:
        assert sorted(history[step]) == sorted(tb[step]), step
        for k, v in tb[step].items():
            assert np.float32(history[step][k]) == np.float32(v), (step, k, history[step][k], v)
    lines = {m["step"]: m for m in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())}
    assert sorted(lines) == sorted(tb)
    return history


def _sft(*overrides):
    return to_dataclass(SftConfig, load_config(str(REPO / "configs/sft_stage1.py:smoke"),
                                               ["--config.train.progress=False", *W, *overrides]))


def test_sft_logs_what_tensorboard_logs_and_a_restart_continues_the_run(tmp_path):
    train(_sft("--config.train.steps=2", "--config.checkpoint.every=1", "--config.train.eval_every=1"), tmp_path)
    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    # A restart (more steps) resumes from checkpoint 2 and logs steps 3-4 into the same run.
    train(_sft("--config.train.steps=4", "--config.checkpoint.every=1", "--config.train.eval_every=1"), tmp_path)
    runs = wandb_runs(tmp_path)
    assert len(runs) == 2 and {r["id"] for r in runs} == {run_id}
    first = runs[0]
    assert first["project"] == "vt-test" and first["name"] == tmp_path.name and first["tags"] == ["tiny", "ci"]
    assert first["job_type"] == "sft"
    assert first["config"]["optim"]["lr"] == 0.003 and first["config"]["train"]["steps"] == 2  # the resolved config
    assert runs[1]["config"]["train"]["steps"] == 4
    history = assert_same_scalars(tmp_path, runs)
    assert sorted(history) == [1, 2, 3, 4]
    assert {"loss", "lr", "grad_norm", "eval_loss", "tokens_per_s"} <= set(history[4])


def test_rl_logs_what_tensorboard_logs(tmp_path):
    cfg = to_dataclass(RLConfig, load_config(str(REPO / "configs/mgpo_math.py:smoke"), [
        *W, "--config.logging.wandb_run_name=rl-tiny", "--config.logging.wandb_group=g1"]))
    train_rl(cfg, tmp_path)
    (run,) = wandb_runs(tmp_path)
    assert run["name"] == "rl-tiny" and run["group"] == "g1" and run["job_type"] == "rl"
    assert run["config"]["mgpo"] == json.loads(json.dumps(cfg.mgpo.__dict__))
    history = assert_same_scalars(tmp_path, [run])
    assert sorted(history) == [0, 1, 2]  # step 0: the held-out accuracy before training
    assert {"reward_mean", "loss", "eval_accuracy"} <= set(history[1]) | set(history[2])


def test_summary_and_run_per_workdir(tmp_path):
    cfg = LoggingConfig(wandb_project="vt-test", wandb_group="pipe", wandb_run_name="demo/eval", wandb_tags=("eval",))
    log_summary(cfg, tmp_path, {"math": {"pass@1": 0.25, "n": 4}, "note": "text", "bad": float("nan")},
                config={"a": 1}, job_type="eval")
    (run,) = wandb_runs(tmp_path)
    assert run["name"] == "demo/eval" and run["group"] == "pipe" and run["config"] == {"a": 1}
    assert run["summary"] == {"math/pass@1": 0.25, "math/n": 4}  # numbers only, nested keys joined
    log_summary(LoggingConfig(), tmp_path / "off", {"x": 1.0}, config={}, job_type="eval")
    assert not (tmp_path / "off").exists()  # W&B off: nothing written


def test_bad_logging_fields_are_named(tmp_path):
    with pytest.raises(VtError, match=r"config\.logging\.wandb_mode: 'cloud': expected one of"):
        _sft("--config.logging.wandb_mode=cloud")
    with pytest.raises(VtError, match=r"no field 'logging'|unknown field"):
        to_dataclass(SftConfig, {"logging": {"wandb_projekt": "x"}})


def test_recipe_gives_each_stage_its_run_in_one_group(tmp_path):
    from vt.recipe.runner import fingerprint, recipe_config
    from vt.recipe.stages import Context
    demo = str(REPO / "configs" / "demo.py:ci")
    on = Context(recipe_config(load_config(demo, ["--config.logging.wandb_project=vt-test"]), tmp_path), tmp_path,
                 dry=True)
    off = Context(recipe_config(load_config(demo), tmp_path), tmp_path, dry=True)
    for stage, learner in (("sft1", lambda c: c), ("rl_math", lambda c: c.rl),
                           ("self_distill", lambda c: c.sft)):
        plan = on.plan(stage)
        lg = learner(plan.config).logging
        assert lg.wandb_project == "vt-test" and lg.wandb_run_name == f"{on.cfg.name}/{stage}"
        assert lg.wandb_group == f"{on.cfg.name}-{tmp_path.name}" and lg.wandb_tags == (stage,)
        assert learner(off.plan(stage).config).logging.wandb_project == ""
        # W&B on or off: the same stage fingerprint, so turning it on never re-runs a finished stage.
        assert fingerprint(plan.config, tmp_path) == fingerprint(off.plan(stage).config, tmp_path)
