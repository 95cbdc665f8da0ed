"""bench/gpu_check.py cannot run its real shapes here (no GPU): it must import without JAX and run end to end on
CPU with --tiny, printing its one table, the transformers + PyTorch peers and their ratios included, with the
options of the next device run (both decode kernels, a flags variant, profiles)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from testutil import REPO


def test_import_does_not_start_jax():
    code = "import sys; sys.path.insert(0, 'bench'); import gpu_check; assert 'jax' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_tiny_run_on_cpu(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))}, "JAX_PLATFORMS": "cpu"}
    cache = tmp_path / "jax-cache"
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--json", str(tmp_path / "out.json"),
                           "--compilation-cache", str(cache), "--profile", "3", "--decode-attention", "auto,pallas",
                           "--variant-xla-flags=--xla_gpu_dot_merger_threshold_mb=0", "--variant-only", "sampler"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    table = proc.stdout[proc.stdout.rindex("check "):]  # the last table: the variant child's own comes first
    assert [line.split()[0] for line in table.splitlines()[2:10]] == [
        "sampler", "sampler:pallas", "attention", "sft", "rl", "torch-sft", "torch-generate", "sampler[+flags]"]
    assert "FAILED" not in table and "MFU" in table and "HBM" in table and table.count("vt / torch") == 2
    assert table.count("x sampler's") == 2  # the other kernel and the flags variant, against the first sampler
    assert proc.stdout.count("device operations of one profiled step") >= 4  # sampler x 2, sft, rl (+ the variant)
    assert cache.is_dir()
    rows = {r["check"]: r for r in json.loads((tmp_path / "out.json").read_text())["rows"]}
    assert rows["sft"]["numbers"]["mfu"] > 0 and rows["sft"]["numbers"]["tokens_per_s"] > 0
    assert 0 < rows["sft"]["numbers"]["compile_s"] < rows["sft"]["numbers"]["first_step_s"]
    for peer in ("torch-sft", "torch-generate"):
        assert rows[peer]["numbers"]["tokens_per_s"] > 0 and rows[peer]["numbers"]["vt_over_torch"] > 0
    assert rows["sampler"]["numbers"]["decode_steps"] >= 15 and rows["sampler"]["numbers"]["tokens"] == 8 * 16  # the first token comes from prefill
    assert 0 < rows["sampler"]["numbers"]["hbm_fraction"] and rows["rl"]["numbers"]["step_s"] > 0
    assert all(rows[c]["numbers"]["profile"] for c in ("sampler", "sampler:pallas", "sft", "rl"))
    assert rows["sampler[+flags]"]["numbers"]["tokens"] == rows["sampler"]["numbers"]["tokens"]
    # the three attention forms (JAX's XLA form on CPU) compute the same attention on one-segment rows
    assert rows["attention"]["numbers"]["max_abs_diff_vs_mask"] == {"mask+causal": 0.0, "causal": 0.0}
