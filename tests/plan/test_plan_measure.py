"""`vt plan`'s measuring on the CPU (no libtpu): a recipe compiles each distinct program once, the program key
tells constants from shapes, and the overrides a DOES NOT FIT line prints make the program fit."""

import jax
import pytest

from vt.config import load_config
from vt.plan import programs as pg
from vt.plan.run import _fix_text, measure, measure_all, stages, try_fixes
from vt.model.config import preset
from vt.sharding import MeshConfig, make_mesh
from vt.train.optim import OptimConfig

HBM = 16 * 10 ** 9


@pytest.fixture
def compiles(monkeypatch):
    """Every compile of a lowered program, counted (the real compile runs)."""
    calls = []
    real = jax.stages.Lowered.compile

    def counted(self, *a, **kw):
        calls.append(self)
        return real(self, *a, **kw)
    monkeypatch.setattr(jax.stages.Lowered, "compile", counted)
    return calls


@pytest.mark.slow
def test_recipe_compiles_each_distinct_program_once(compiles):
    """The demo recipe (every stage) on one CPU device: one compile per distinct program key, every later stage with
    that program given the first one's numbers (and its own resident bytes); the SFT stages that share a shape
    share a program, as do the eval benchmarks."""
    rows = measure_all([p for s in stages(load_config("configs/demo.py").to_dict(), jax.devices()[:1], HBM)
                        for p in s.programs], HBM)
    keys = [r["key"] for r in rows]
    assert len(compiles) == len(set(keys)) < len(rows)
    first = {}
    for r in rows:
        if r["key"] not in first:
            assert "same_as" not in r and r["compile_s"] > 0
            first[r["key"]] = r
            continue
        f = first[r["key"]]
        assert r["same_as"] == f"{f['stage']}/{f['program']}" and r["compile_s"] == 0
        assert r["bytes"] - r["resident_bytes"] == f["bytes"] - f["resident_bytes"]
    by = {(r["stage"], r["program"]): r for r in rows}
    assert by["self_distill.sft", "train_step"]["same_as"] == "sft1/train_step"
    evals = [r for r in rows if r["stage"].startswith("eval.") and r["program"] == "decode"]
    assert len(evals) > 1 and len({r["key"] for r in evals}) == 1
    # `vt plan --reuse`: a second run given the first one's rows compiles nothing but what changed (select's slots
    # here, and with them its KV pool: its prefill and decode), with the same numbers for the rest
    n = len(compiles)
    raw = load_config("configs/demo.py", ["--config.stages.select.sampler.batch_size=64"]).to_dict()
    again = measure_all([p for s in stages(raw, jax.devices()[:1], HBM) for p in s.programs], HBM, earlier=rows)
    fresh = [r for r in again if "same_as" not in r]
    assert len(compiles) - n == len(fresh) > 0 and {r["stage"] for r in fresh} == {"select"}
    assert all(a["bytes"] == r["bytes"] for a, r in zip(again, rows) if a["stage"] != "select")
    # and a third run given the second one's rows (most of them reused there) compiles nothing
    n = len(compiles)
    third = measure_all([p for s in stages(raw, jax.devices()[:1], HBM) for p in s.programs], HBM, earlier=again)
    assert len(compiles) == n and [r["bytes"] for r in third] == [r["bytes"] for r in again]


def test_key_blanks_constants_not_shapes():
    """A learning rate is a constant of the program (one key, the same bytes); a row length is a shape (two)."""
    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), jax.devices()[:1])
    cfg = preset("tiny")

    def build(lr, seq):
        return pg.sft_step(pg.train_setup(cfg, mesh, OptimConfig(lr=lr)), mesh, 2, 2, seq)
    a, b, c = build(1e-5, 64), build(3e-4, 64), build(1e-5, 128)
    la, lb, lc = a.lower(), b.lower(), c.lower()
    assert la.as_text() != lb.as_text()  # the constants differ...
    assert pg.program_key(la, mesh) == pg.program_key(lb, mesh) != pg.program_key(lc, mesh)  # ...the program not
    ma, mb = la.compile().memory_analysis(), lb.compile().memory_analysis()
    assert (ma.temp_size_in_bytes, ma.argument_size_in_bytes) == (mb.temp_size_in_bytes, mb.argument_size_in_bytes)


def _program(spec, overrides, program, hbm, devices):
    raw = load_config(spec, overrides).to_dict()
    return raw, next(p for s in stages(raw, devices, hbm) for p in s.programs if p.name == program)


@pytest.mark.parametrize("spec, program, knob", [
    ("configs/sft_stage1.py:smoke", "train_step", "--config.data.grad_accum_steps=4"),
    ("configs/mgpo_math.py:smoke", "update", "--config.train.tokens_per_micro_batch="),
    ("configs/eval_aime25.py:smoke", "decode", "--config.sampling.kv_pages=0"),
])
def test_the_fixes_printed_fit(spec, program, knob):
    """A program 1 byte over the HBM: DOES NOT FIT; try_fixes compiles each suggested change (the micro-batch /
    accumulation / KV pool knob among them), and the ones it reports as fitting, the most bytes saved first, make
    the same program fit when given as the command line's overrides, with the bytes it reported."""
    pre = ["--config.sampling.kv_pages=4096"] if "eval" in spec else []  # a pool of the user's size
    devices = jax.devices()[:1]
    _, p = _program(spec, pre, program, HBM, devices)
    ref = measure(p, HBM)
    assert ref["verdict"] == "fits"
    hbm = ref["bytes"] - 1
    raw, p = _program(spec, pre, program, hbm, devices)
    compiled = {}
    row = measure(p, hbm, compiled)
    assert row["verdict"] == "DOES NOT FIT" and row["bytes"] == ref["bytes"]
    tried = try_fixes(raw, p, devices, hbm, compiled)
    fits = [t for t in tried if t["verdict"] == "fits"]
    assert fits and any(o.startswith(knob) for t in fits for o in t["overrides"]), tried
    assert [t["bytes"] for t in fits] == sorted(t["bytes"] for t in fits) and tried[:len(fits)] == fits
    assert all(t["bytes"] > hbm for t in tried[len(fits):] if "bytes" in t)
    text = _fix_text(dict(row, fixes=tried))
    assert text.startswith("fits with") and all(t["fix"] in text for t in fits)
    assert not any(t["fix"] in text for t in tried[len(fits):])  # printed: only what fits
    _, again = _program(spec, pre + fits[0]["overrides"], program, hbm, devices)
    after = measure(again, hbm)
    assert after["verdict"] == "fits" and after["bytes"] == fits[0]["bytes"] < ref["bytes"], (fits[0], after)


@pytest.mark.devices(2)
def test_a_one_device_sampler_is_told_to_use_the_others():
    """An eval sampler on one device of two (mesh fsdp 1) 1 byte over: sharding it over both (model.mesh.fsdp=-1)
    is among the fixes that fit."""
    devices = jax.devices()
    assert len(devices) == 2
    pre = ["--config.sampling.kv_pages=4096"]
    _, p = _program("configs/eval_aime25.py:smoke", pre, "decode", HBM, devices)
    hbm = measure(p, HBM)["bytes"] - 1
    raw, p = _program("configs/eval_aime25.py:smoke", pre, "decode", hbm, devices)
    compiled = {}
    assert measure(p, hbm, compiled)["verdict"] == "DOES NOT FIT"
    tried = try_fixes(raw, p, devices, hbm, compiled)
    spread = next(t for t in tried if t["overrides"] == ["--config.model.mesh.fsdp=-1"])
    assert spread["verdict"] == "fits", tried
