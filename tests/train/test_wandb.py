"""W&B beside TensorBoard (vt.tracking), offline: a tiny SFT and RL job log the same scalars to both (same keys,
same values per step), a restarted job continues the same W&B run, eval and pipeline stages get one run each."""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from vt import VtError
from vt.config import load_config, to_dataclass
from vt.rl.learner import RLConfig, train_rl
from vt.tracking import RUN_ID_FILE, LoggingConfig, log_summary
from vt.train.sft import SftConfig, train

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402  (only with the extra installed)
from tensorboardX.proto import event_pb2  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
W = ["--config.logging.wandb_project=vt-test", "--config.logging.wandb_tags=('tiny', 'ci')"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network here
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # not the user's ~/.config/wandb


# --- readers: W&B's offline .wandb file and TensorBoard's event files, both read from the bytes -----------------

def _leveldb_log_records(data: bytes):
    """The records of a .wandb file: wandb's header (":W&B", magic, version), then LevelDB's log format (32 KiB
    blocks of chunks: crc32c, length, type FULL/FIRST/MIDDLE/LAST)."""
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", ident
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            break
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # wandb-core writes keys as nested_key


def wandb_runs(workdir: Path) -> list[dict]:
    """Every offline run directory under workdir/wandb, oldest first: its run id, name, group, tags, config,
    job type, history ({step: {key: value}}) and summary."""
    wandb.teardown()  # run.finish() returns before wandb-core has written the file out; its shutdown waits for that
    out = []
    for d in sorted((workdir / "wandb").glob("offline-run-*")):
        run = {"history": {}, "summary": {}, "config": {}}
        for rec in _leveldb_log_records(next(d.glob("run-*.wandb")).read_bytes()):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r = rec.run
                run.update(id=r.run_id, name=r.display_name, group=r.run_group, tags=list(r.tags), job_type=r.job_type,
                           project=r.project)
                run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update if i.key != "_wandb"})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update if i.key != "_wandb"})
            elif kind == "history":
                items = {_key(i): json.loads(i.value_json) for i in rec.history.item}
                run["history"][rec.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
            elif kind == "summary":
                run["summary"].update({_key(i): json.loads(i.value_json) for i in rec.summary.update
                                       if not _key(i).startswith("_")})
        out.append(run)
    return out


def tensorboard_scalars(tb_dir: Path) -> dict[int, dict[str, float]]:
    """{step: {tag: value}} from TFRecord event files in write order, honouring tensorboardX's purge_step (a
    file that starts at step s discards what earlier files hold at steps >= s)."""
    out: dict[int, dict[str, float]] = {}
    for f in sorted(tb_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns):
        data, pos, first = f.read_bytes(), 0, True
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            ev = event_pb2.Event()
            ev.ParseFromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            if first and ev.step > 0:
                out = {s: v for s, v in out.items() if s < ev.step}
            first = False
            for v in ev.summary.value:
                out.setdefault(ev.step, {})[v.tag] = v.simple_value
    return out


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
    from vt.recipe.runner import _plan, fingerprint, recipe_config
    from vt.recipe.stages import Context
    demo = str(REPO / "configs" / "demo.py:ci")
    on = Context(recipe_config(load_config(demo, ["--config.logging.wandb_project=vt-test"]), tmp_path), tmp_path,
                 dry=True)
    off = Context(recipe_config(load_config(demo), tmp_path), tmp_path, dry=True)
    for stage, learner in (("sft1", lambda c: c), ("rl_math", lambda c: c["rl"]),
                           ("self_distill", lambda c: c["sft"])):
        plan = _plan(on, stage)
        lg = learner(plan.config).logging
        assert lg.wandb_project == "vt-test" and lg.wandb_run_name == f"{on.cfg.name}/{stage}"
        assert lg.wandb_group == f"{on.cfg.name}-{tmp_path.name}" and lg.wandb_tags == (stage,)
        assert learner(_plan(off, stage).config).logging.wandb_project == ""
        # W&B on or off: the same stage fingerprint, so turning it on never re-runs a finished stage.
        assert fingerprint(plan.config, tmp_path) == fingerprint(_plan(off, stage).config, tmp_path)
