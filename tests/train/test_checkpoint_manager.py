"""The checkpoint manager: round trip, retention, seals and checksums, leftover clean-up."""
import json
import shutil

import grain
import jax
import numpy as np
import pytest

from train_helpers import tiny_setup  # noqa: F401 (fixture)
from vt import VtError
from vt.checkpoint.manager import CHECKSUM_FILE, CheckpointConfig, CheckpointManager
from vt.train.optim import OptimConfig, make_optimizer
from vt.train.state import abstract_train_state, init_train_state, train_state_shardings


@pytest.fixture(scope="module")
def state_bits(tiny_setup):
    cfg, mesh, md, params = tiny_setup
    opt, _ = make_optimizer(OptimConfig(), 10)
    sh = train_state_shardings(md, opt, mesh)
    state = init_train_state(params, opt, sh, seed=3)
    return cfg, state, abstract_train_state(md, opt, sh)


def _iterator():
    return iter(grain.MapDataset.range(100).map(lambda i: {"x": np.array([i])}).to_iter_dataset())


def test_round_trip_retention_and_model_checkpoint_compat(tmp_path, state_bits):
    cfg, state, abstract = state_bits
    it = _iterator()
    next(it), next(it)
    mgr = CheckpointManager(tmp_path, CheckpointConfig(keep=2, best_metric="eval_loss"), cfg)
    for step, ev in zip([1, 2, 3, 4], [5.0, 1.0, 3.0, 4.0]):
        mgr.save(step, state, it, metrics={"eval_loss": ev})
    mgr.close()
    assert mgr.all_steps() == [2, 3, 4]  # newest 2 plus the best eval_loss (step 2)
    it2 = _iterator()
    r = CheckpointManager(tmp_path, CheckpointConfig(), cfg).restore(4, abstract, it2)
    assert int(next(it2)["x"][0]) == 2  # the data iterator continues where it was saved
    np.testing.assert_array_equal(r.rng, np.asarray(state.rng))
    for k in state.params:
        np.testing.assert_array_equal(np.asarray(r.params[k]), np.asarray(state.params[k]))
    assert jax.tree.structure(r.opt_state) == jax.tree.structure(state.opt_state)
    from vt.checkpoint.params import load_model
    model = load_model(tmp_path / "4")  # a step directory is a model checkpoint
    assert model.cfg == cfg


def test_corruption_is_an_error_naming_the_step(tmp_path, state_bits):
    cfg, state, abstract = state_bits
    mgr = CheckpointManager(tmp_path, CheckpointConfig(async_save=False), cfg)
    mgr.save(7, state)
    mgr.close()
    record = json.loads((tmp_path / "7" / CHECKSUM_FILE).read_text())
    victim = max((p for p in (tmp_path / "7" / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    assert victim.relative_to(tmp_path / "7").as_posix() in record["files"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(VtError, match=r"checkpoint step 7 is corrupted: .*checksum mismatch"):
        CheckpointManager(tmp_path, CheckpointConfig(), cfg).restore(7, abstract)


def test_leftovers_of_a_crash_are_removed(tmp_path, state_bits):
    cfg, state, _ = state_bits
    mgr = CheckpointManager(tmp_path, CheckpointConfig(), cfg)
    mgr.save(1, state)
    mgr.close()
    shutil.copytree(tmp_path / "1", tmp_path / "2")
    (tmp_path / "2" / CHECKSUM_FILE).unlink()  # finalised by orbax, never sealed: the crash hit in between
    (tmp_path / "3.orbax-checkpoint-tmp-1234").mkdir()
    mgr = CheckpointManager(tmp_path, CheckpointConfig(), cfg)
    assert sorted(mgr.cleaned) == ["2", "3.orbax-checkpoint-tmp-1234"]
    assert mgr.all_steps() == [1] and mgr.latest_step() == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("_")) == ["1"]
    mgr.close()
