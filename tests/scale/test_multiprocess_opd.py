"""On-policy distillation on several hosts (issue 51): `vt train` with configs/opd.py:smoke on 2 processes x 4
simulated devices (launch/local.sh) against 1 process x 8 devices, mesh (data 2, fsdp 2, tensor 2). The teacher
is another model than the tiny Qwen2 student: the tiny Qwen3 twin with a fourth layer (head_dim 24, q/k norms; the
vocabulary shared), in float32.

On 2 processes each one's teacher scores that process's own samples on its 4 devices (its sampler's mesh) as
they finish; on 1 process the teacher is on the learner's 8-device mesh. Sampling is keyed by (seed, prompt in
the whole step, sample), so both runs sample the same completions (equal rollout hashes), and the teachers must
give the same log-probs: the step's OPD metrics (over every process's tokens: reverse KL, teacher and student
log-probs, the teacher tokens scored) agree to 1e-5, float32 rows laid out alike on both; the losses (the
surrogate at pi_old = pi: the mean advantage, not near zero as MGPO's) to rtol 1e-5, the two partitionings
reducing in different orders.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from test_multiprocess import TIMEOUT, _env, _local, _run
from testutil import build_once

OPD = ["--config", "configs/opd.py:smoke"]
OVERRIDES = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2", "--config.train.steps=2",
             "--config.rollout.sampler.max_new_tokens=24", "--config.checkpoint.every=2",
             "--config.opd.teacher_dtype=float32", "--config.data.eval="]
LOGP_ATOL = 1e-5
LOSS_RTOL = 1e-5


@pytest.fixture(scope="module")
def opd_runs(shared_dir) -> Path:
    """Built once a session (testutil.build_once): the tests only read it."""
    def build(d: Path) -> None:
        from vt.checkpoint.params import save_model
        from vt.model.config import preset
        from vt.model.qwen2 import create_model
        save_model(d / "teacher", create_model(preset("tiny-qwen3", num_layers=4), None, seed=11))
        teacher = [f"--config.opd.teacher={d / 'teacher'}"]
        _local([sys.executable, "-m", "vt", "train", *OPD, "--workdir", d / "two", *OVERRIDES, *teacher],
               "2 processes x 4 devices: vt train (OPD)", d / "logs")
        _run(["timeout", "-k", "10", TIMEOUT, sys.executable, "-m", "vt", "train", *OPD, "--workdir", d / "one",
              *OVERRIDES, *teacher], _env(8), "1 process x 8 devices: vt train (OPD)")
    return build_once("scale_opd", build)


def _steps(workdir: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    return {x["step"]: x for x in lines}


def test_opd_on_two_processes_like_one(opd_runs):
    one, two = _steps(opd_runs / "one"), _steps(opd_runs / "two")
    assert sorted(one) == sorted(two) == [1, 2]
    for s in (1, 2):
        a, b = one[s], two[s]
        assert b["rollout_hash"] == a["rollout_hash"], f"step {s}: the processes sampled other completions"
        assert b["opd/teacher_tokens"] == a["opd/teacher_tokens"] > 0, s  # every process's, not process 0's
        for k in ("opd/teacher_logp", "opd/student_logp", "opd/reverse_kl", "opd/abs_logp_gap"):
            np.testing.assert_allclose(b[k], a[k], rtol=0, atol=LOGP_ATOL, err_msg=f"step {s}: {k}")
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=LOSS_RTOL, err_msg=f"step {s}")
        assert a["opd/abs_logp_gap"] > 0.1  # two different random models: the teacher's signal is not nil
