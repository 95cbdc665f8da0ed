"""vt's programs compiled for TPU topologies from this CPU host (libtpu's compile-only devices), and `vt plan`.

Every compile runs in a child process with JAX_PLATFORMS=cpu and ALLOW_MULTIPLE_LIBTPU_LOAD=1: libtpu takes a
lockfile when it loads, and an xdist worker whose JAX probed for a TPU (and found none) may hold it already."""
import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

from testutil import REPO, run_vt

pytestmark = pytest.mark.skipif(find_spec("libtpu") is None, reason="libtpu is not installed (pip install 'vt[tpu]')")

TPU_ENV = {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def _child(topology: str, what: str) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "plan" / "tpu_compile_child.py"), topology, what],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, **TPU_ENV}, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["program"]: r for r in map(json.loads, (ln for ln in proc.stdout.splitlines() if ln.startswith("{")))}


@pytest.mark.slow
@pytest.mark.parametrize("topology, processes", [("v5p-8", 1), ("v5p-16", 2)])
def test_tiny_programs_compile_with_tpu_kernels(topology, processes):
    """The SFT step and the RL update (splash attention, forward and backward) and the sampler's decode (the
    Pallas paged-attention kernel under shard_map) compile for a single-host and a multi-host slice, the
    kernels in the compiled programs as Mosaic custom calls. The platform is the mesh's, not the process's."""
    rows = _child(topology, "sft,rl_update,decode")
    p = rows["platform"]
    assert (p["platform"], p["default_backend"], p["auto"], p["processes"]) == ("tpu", "cpu", "splash", processes)
    for name in ("sft", "rl_update", "decode"):
        assert rows[name]["kernels"] >= 1, (name, rows[name])
        assert rows[name]["temp_bytes"] > 0


@pytest.mark.slow
def test_plan_names_the_program_that_does_not_fit(tmp_path):
    """A KV pool of 10M pages (123 GB a device for the tiny model) cannot fit a v5p chip's 95 GB: the TPU compiler
    refuses the program (CompileTimeHbmOom), and vt plan exits 1 naming it with its bytes and what to change; the
    JSON rows say the same."""
    out = tmp_path / "plan.json"
    proc = run_vt("plan", "--config", "configs/eval_aime25.py:smoke", "--topology", "v5p-8", "--no-progress",
                  "--json", str(out), "--config.model.mesh.fsdp=-1", "--config.sampling.kv_pages=10000000",
                  env=TPU_ENV)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("eval/decode:"))
    assert "GB a device" in line and "more than the 95.00 GB of v5p-8" in line and "kv_pages" in line
    rows = {r["program"]: r for r in json.loads(out.read_text())}
    assert rows["decode"]["verdict"] == "DOES NOT FIT" and rows["decode"]["bytes"] > 95e9


@pytest.mark.slow
def test_plan_fits_and_bad_input(tmp_path):
    """Everything fits: exit 0, a row per program; an unknown topology: exit 2, one line naming the choices."""
    out = tmp_path / "plan.json"
    ok = run_vt("plan", "--config", "configs/eval_aime25.py:smoke", "--topology", "v6e-8", "--no-progress",
                "--json", str(out), "--config.model.mesh.fsdp=-1", env=TPU_ENV)
    assert ok.returncode == 0, ok.stdout + ok.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["program"], r["verdict"]) for r in rows] == [("prefill", "fits"), ("decode", "fits")]
    assert all(0 < r["bytes"] <= r["hbm_bytes"] == 32 * 10 ** 9 for r in rows)
    bad = run_vt("plan", "--config", "configs/eval_aime25.py:smoke", "--topology", "v5p-7", env=TPU_ENV)
    assert bad.returncode == 2 and "unknown topology" in bad.stderr and "v5p-8" in bad.stderr
