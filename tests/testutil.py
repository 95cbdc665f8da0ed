"""Shared test helpers: tiny random-weight transformers Qwen2 / Qwen3 checkpoints built on the spot (no downloads)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]

def build_once(name: str, build: Callable[[Path], None]) -> Path:
    """`build(path)` once per test session, whichever xdist worker or devices(n) child asks first; the others wait
    for it (a file lock) and read what it made. So an expensive fixture (a demo run, multi-process launches, the
    RL task's SFT) is not run again by each worker its module's tests land on. Built in place, so paths a run
    records inside stay valid; `{path}.built` marks it whole (a build that failed part-way is started over)."""
    path = Path(os.environ["VT_TEST_SHARED_DIR"]) / name
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = Path(f"{path}.built")
        if not marker.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            build(path)
            marker.touch()
    return path


# Odd sizes on purpose (issue 2): 3 layers, hidden 96, 6 query heads, 2 KV heads.
TINY_HF = dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
               num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6)


# Qwen3 twins, one shape each for tied and untied (neither the Qwen2 one): head_dim stated and != hidden / heads.
TINY_HF_QWEN3 = {
    True: dict(TINY_HF, hidden_size=80, intermediate_size=144, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=24),
    False: dict(TINY_HF, hidden_size=96, intermediate_size=176, num_hidden_layers=3, num_attention_heads=8,
                num_key_value_heads=4, head_dim=20, rope_theta=1_000_000.0),
}


def make_hf_model(tie: bool, seed: int = 0, arch: str = "qwen2", **overrides):
    """transformers Qwen2ForCausalLM (arch "qwen2") or Qwen3ForCausalLM ("qwen3") with random weights, non-zero
    biases and non-unit norms (so a dropped bias, a skipped q/k norm or a norm applied as (1 + w) cannot pass
    unnoticed)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    name = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[arch]
    shape = TINY_HF if arch == "qwen2" else TINY_HF_QWEN3[tie]
    cfg = getattr(transformers, f"{name}Config")(**{**shape, **overrides}, tie_word_embeddings=tie)
    model = getattr(transformers, f"{name}ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.5)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
    return model


@pytest.fixture(scope="module")
def tiny_setup():
    """The tiny preset on one device: (ModelConfig, mesh, ModelDef, flat params of seed 0)."""
    import jax
    from vt.checkpoint.params import flat_params
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.sharding import MeshConfig, make_mesh
    from vt.train.state import ModelDef
    cfg = preset("tiny")
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    return cfg, mesh, ModelDef(cfg), flat_params(create_model(cfg, mesh, seed=0))


def tool_demo_sft1() -> Path:
    """The work directory of `vt demo --variant tools --until sft1` (its data, tokenizer and SFT-1 model), run once a
    session for the tool tests that read it (tests/recipe/test_tool_demo.py, tests/rl/test_tool_learning.py and
    test_tool_parity.py)."""
    return build_once("tool_demo_sft1", lambda root: run_vt("demo", "--variant", "tools", "--workdir", str(root),
                                                            "--until", "sft1", check=True))


def run_vt(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "vt", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"vt {' '.join(args)} failed:\n{proc.stderr}")
    return proc


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


# --- readers: W&B's offline .wandb file and TensorBoard's event files, both read from the bytes -----------------

def _leveldb_log_records(data: bytes):
    """The records of a .wandb file: wandb's header (":W&B", magic, version), then LevelDB's log format (32 KiB
    blocks of chunks: crc32c, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto.wandb_internal_pb2 import Record  # the wandb extra
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
            rec = Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # wandb-core writes keys as nested_key


def wandb_runs(workdir: Path) -> list[dict]:
    """Every offline run directory under workdir/wandb, oldest first: its run id, name, group, tags, config,
    job type, history ({step: {key: value}}) and summary."""
    import wandb
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
    from tensorboardX.proto.event_pb2 import Event
    out: dict[int, dict[str, float]] = {}
    for f in sorted(tb_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns):
        data, pos, first = f.read_bytes(), 0, True
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            ev = Event()
            ev.ParseFromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            if first and ev.step > 0:
                out = {s: v for s, v in out.items() if s < ev.step}
            first = False
            for v in ev.summary.value:
                out.setdefault(ev.step, {})[v.tag] = v.simple_value
    return out
