"""`vt plan`'s measuring on the CPU (no libtpu): a recipe compiles each distinct program once, the program key
tells constants from shapes, and the overrides a DOES NOT FIT line suggests make the program fit."""
import re

import jax
import pytest

from vt.config import load_config
from vt.plan import programs as pg
from vt.plan.run import measure_all, stages
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


def _row(spec, overrides, program, hbm):
    st = stages(load_config(spec, overrides).to_dict(), jax.devices()[:1], hbm)
    return next(r for r in measure_all([p for s in st for p in s.programs if p.name == program], hbm))


def _overrides(fix: str) -> list[str]:
    return re.findall(r"(--config\.\S+=\S+)", fix)


@pytest.mark.parametrize("spec, program, first", [
    ("configs/sft_stage1.py:smoke", "train_step", "--config.data.grad_accum_steps=4"),
    ("configs/mgpo_math.py:smoke", "update", "--config.train.tokens_per_micro_batch="),
    ("configs/eval_aime25.py:smoke", "decode", "--config.sampling.kv_pages=0"),
])
def test_suggestion_makes_it_fit(spec, program, first):
    """A program 1 byte over the HBM: DOES NOT FIT, its first suggested override is the micro-batch /
    accumulation / KV pool knob, and with that override the same program fits the same HBM."""
    pre = ["--config.sampling.kv_pages=4096"] if "eval" in spec else []  # a pool of the user's size
    ref = _row(spec, pre, program, HBM)
    assert ref["verdict"] == "fits"
    hbm = ref["bytes"] - 1
    row = _row(spec, pre, program, hbm)
    assert row["verdict"] == "DOES NOT FIT" and row["bytes"] == ref["bytes"]
    fix = _overrides(row["fix"])
    assert fix[0].startswith(first), row["fix"]
    assert any(f.startswith("--config.model.lora_rank=") for f in fix) or "eval" in spec
    after = _row(spec, pre + fix[:1], program, hbm)
    assert after["verdict"] == "fits" and after["bytes"] < ref["bytes"], (row["fix"], after)
