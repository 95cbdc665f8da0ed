"""Whole learner runs in-process: every config loads and its smoke variant trains; the chat pipeline feeds the
learner; a non-finite step halts before a checkpoint; the synthetic task's held-out loss falls clearly."""
import json
import math
from pathlib import Path

import pytest

from vt import VtError
from vt.config import load_config, to_dataclass
from vt.train.sft import SftConfig, train

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("sft_stage*.py"))
QUIET = ["--config.train.progress=False"]


def _cfg(spec, *overrides):
    return to_dataclass(SftConfig, load_config(str(REPO / spec), [*QUIET, *overrides]))


def _metrics(workdir):
    return [json.loads(x) for x in (Path(workdir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("spec", CONFIGS)
def test_config_loads_and_smoke_variant_trains(spec, tmp_path):
    full = _cfg(spec)
    assert full.model.preset == "qwen2.5-coder-3b" and full.optim.lr == 5e-5 and full.optim.final_lr == 8e-8
    assert full.optim.warmup_frac == 0.05 and full.data.global_batch_size == 128
    result = train(_cfg(spec + ":smoke", "--config.train.steps=2", "--config.checkpoint.every=2",
                        "--config.train.peak_flops=1e12"), tmp_path)
    assert result.status == "finished" and result.step == 2
    lines = _metrics(tmp_path)
    assert [m["step"] for m in lines] == [1, 2]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "padding_fraction", "batch_hash"):
        assert key in lines[-1], key
    assert "eval_loss" in lines[-1] and (tmp_path / "tb").is_dir()
    assert (tmp_path / "checkpoints" / "2" / "vt_checksums.json").is_file()


def test_chat_pipeline_feeds_the_learner(tmp_path):
    """data.kind=chat end to end: tiny BPE tokenizer, a chat JSONL, step count from one pass over the data."""
    from vt.data.tokenizer import build_tiny_tokenizer
    tok_dir = tmp_path / "tok"
    build_tiny_tokenizer(tok_dir, vocab_size=400)
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus {i + 1}?"},
                          {"role": "assistant", "content": f"<think>add</think>{2 * i + 1}"}]} for i in range(48)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg("configs/sft_stage1.py:smoke", "--config.data.kind=chat", f"--config.data.train={tmp_path}/train.jsonl",
               f"--config.data.eval={tmp_path}/train.jsonl", f"--config.data.tokenizer={tok_dir}",
               "--config.data.seq_len=128", "--config.train.steps=0", "--config.data.num_epochs=1.0",
               "--config.checkpoint.every=100")
    result = train(cfg, tmp_path / "run")
    lines = _metrics(tmp_path / "run")
    assert result.step == len(lines) >= 1
    assert all(math.isfinite(m["loss"]) and m["loss_tokens"] > 0 for m in lines)
    assert 0.0 <= lines[0]["padding_fraction"] < 0.5 and "eval_loss" in lines[-1]


def test_non_finite_step_halts_before_any_bad_checkpoint(tmp_path):
    # lr 1e38: step 1 is finite but leaves weights near float32's limit, so step 2's loss overflows.
    cfg = _cfg("configs/sft_stage1.py:smoke", "--config.optim.lr=1e38", "--config.optim.final_lr=1e38",
               "--config.optim.clip_norm=0.0", "--config.optim.warmup_frac=0.0", "--config.train.steps=5",
               "--config.checkpoint.every=1")
    with pytest.raises(VtError, match=r"non-finite loss or gradient at step 2 .*no checkpoint after step 1"):
        train(cfg, tmp_path)
    steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == ["1"]
    assert [m["step"] for m in _metrics(tmp_path)] == [1]


def test_synthetic_sft_drives_heldout_loss_down(tmp_path):
    cfg = _cfg("configs/sft_stage1.py:smoke", "--config.train.steps=300", "--config.train.eval_every=100",
               "--config.checkpoint.every=1000", "--config.data.eval_batches=4")
    train(cfg, tmp_path)
    lines = _metrics(tmp_path)
    evals = [(m["step"], m["eval_loss"]) for m in lines if "eval_loss" in m]
    first = lines[0]["loss"]
    print(f"train loss step 1: {first:.3f}; held-out: {evals}")
    assert first > 5.5  # ~log(512) at init
    # log(48) = 3.87 is the best a model can do without learning the translation table; we must beat it clearly
    assert evals[-1][1] < 1.2 and evals[-1][1] < evals[0][1]


def test_vt_train_dispatches_on_the_learner_field(tmp_path):
    """`vt train` picks the learner by the config's top-level `learner` field: every SFT and RL config names
    its own, a config without one (or naming another learner than its dataclass) is refused by name."""
    from testutil import run_vt
    from vt.rl.learner import RLConfig
    for spec, learner in (("sft_stage1", "sft"), ("sft_stage2", "sft"), ("mgpo_math", "rl"), ("mgpo_code", "rl"),
                          ("mgpo_stem", "rl"), ("long2short", "rl"), ("instruct_rl", "rl")):
        assert load_config(str(REPO / "configs" / f"{spec}.py")).learner == learner, spec
    bare = tmp_path / "bare.py"
    bare.write_text("import ml_collections\n\n\ndef get_config(arg=None):\n"
                    "    c = ml_collections.ConfigDict()\n    c.model = ml_collections.ConfigDict()\n"
                    "    c.model.preset = 'tiny'\n    return c\n")
    proc = run_vt("train", "--config", str(bare), "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 2 and "top-level field `learner` is None" in proc.stderr, proc.stderr
    with pytest.raises(VtError, match=r"config learner='rl': this config is read by the 'sft' learner"):
        to_dataclass(SftConfig, {"learner": "rl"})
    with pytest.raises(VtError, match=r"config learner='sft': this config is read by the 'rl' learner"):
        to_dataclass(RLConfig, {"learner": "sft"})
