"""configs/opd.py:smoke end to end (issue 51): a tiny random student, the real sampler and math verifier, a tiny
checkpoint teacher scoring every sampled token beside decoding; the OPD metrics are written."""
import json

import numpy as np
import pytest

from vt.checkpoint.params import save_model
from vt.config import load_config, to_dataclass
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.rl.learner import RLConfig, train_rl


def test_opd_smoke_config_runs(tmp_path):
    save_model(tmp_path / "teacher", create_model(preset("tiny"), None, seed=11))
    cfg = to_dataclass(RLConfig, load_config("configs/opd.py:smoke",
                                             [f"--config.opd.teacher={tmp_path / 'teacher'}"]).to_dict())
    result = train_rl(cfg, tmp_path / "run")
    assert result.status == "finished" and result.step == 2
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert len(steps) == 2
    for m in steps:
        # two random models: the sampled reverse KL per token is positive on average and the gap is its size
        assert np.isfinite(m["opd/reverse_kl"]) and m["opd/abs_logp_gap"] >= abs(m["opd/reverse_kl"])
        assert m["opd/teacher_logp"] < 0 and m["opd/student_logp"] < 0
        np.testing.assert_allclose(m["opd/student_logp"] - m["opd/teacher_logp"], m["opd/reverse_kl"], atol=1e-4)
        assert m["opd/teacher_tokens"] > 0 and m["opd/teacher_tokens_per_s"] > 0 and m["time_teacher_s"] > 0


def test_opd_stage_wiring_in_the_demo_variant(tmp_path):
    """`vt demo --variant opd`'s opd stage, planned as `vt pipeline --validate` plans it (nothing runs): the student
    starts from sft1's checkpoint, the teacher is rl_instruct's (the demo's final model), no profiling; a stage
    without a teacher is refused naming the field."""
    from vt.recipe.runner import recipe_config, validate

    report = validate(recipe_config(load_config("configs/demo.py:opd"), tmp_path), tmp_path, ["opd"])
    rl = report["stages"]["opd"].rl
    assert rl.model.init_checkpoint == str(tmp_path / "sft1" / "<checkpoint>")
    assert rl.opd.teacher == str(tmp_path / "rl_instruct" / "<checkpoint>") and rl.opd.enabled
    assert report["stages"]["opd"].profile_k == 0 and rl.data.eval.endswith("heldout_instruct.jsonl")
    bad = validate(recipe_config(load_config("configs/demo.py:opd", ["--config.stages.opd.opd.teacher="]),
                                 tmp_path), tmp_path, ["opd"])
    assert bad["problems"] == ["config.stages.opd: config.stages.opd.opd.teacher must name the teacher: a "
                               "checkpoint, an http(s):// endpoint or an earlier stage"]


@pytest.mark.devices(4)
def test_opd_teacher_on_devices_of_its_own_scores_as_on_the_learners_mesh(tmp_path):
    """opd.teacher_devices=2 of 4: the teacher's mesh is the last two devices, the learner's the first two (the
    sampler shares the learner's), and the first step's teacher scores, made before any update, equal those of a
    teacher on the learner's 4-device mesh (float32 teacher: to 1e-5, the row layout being the same)."""
    import jax

    from vt.rl.learner import Learner

    save_model(tmp_path / "teacher", create_model(preset("tiny"), None, seed=11))
    firsts = {}
    for own in (0, 2):
        cfg = to_dataclass(RLConfig, load_config("configs/opd.py:smoke", [
            f"--config.opd.teacher={tmp_path / 'teacher'}", f"--config.opd.teacher_devices={own}",
            "--config.opd.teacher_dtype=float32", "--config.train.steps=1"]).to_dict())
        if own:
            learner = Learner(cfg, tmp_path / "probe")
            devices = jax.devices()
            assert list(learner.teacher.mesh.devices.flat) == devices[2:]
            assert list(learner.mesh.devices.flat) == devices[:2] == list(learner.sampler_mesh.devices.flat)
            for reward in learner.rewards.values():  # built, never run: no engine yet
                reward.close()
        assert train_rl(cfg, tmp_path / f"run{own}").status == "finished"
        firsts[own] = next(json.loads(x) for x in (tmp_path / f"run{own}" / "metrics.jsonl").read_text().splitlines()
                           if '"loss"' in x)
    for key in ("opd/teacher_logp", "opd/student_logp", "opd/reverse_kl", "opd/teacher_tokens"):
        np.testing.assert_allclose(firsts[2][key], firsts[0][key], rtol=0, atol=1e-5, err_msg=key)
