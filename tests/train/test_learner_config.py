"""Every learner's config is a vt.train.loop.LearnerConfig (the sections the shared set-up and loop read) whose
`train` section is a LoopConfig: declared once, so they cannot drift apart between the learners, and set by the
same keys in each (train.eval_every, train.peak_flops, ...)."""
import dataclasses
import typing

import pytest

from vt.config import to_dataclass
from vt.rl.learner import RLConfig
from vt.train.loop import LearnerConfig, LoopConfig
from vt.train.sft import SftConfig


@pytest.mark.parametrize("cls", [SftConfig, RLConfig])
def test_learner_configs_share_the_loop_sections(cls):
    assert issubclass(cls, LearnerConfig)
    hints = typing.get_type_hints(cls)
    assert issubclass(hints["train"], LoopConfig)
    for f in dataclasses.fields(LearnerConfig):  # each shared section has the shared type (a subclass for train)
        assert issubclass(hints[f.name], typing.get_type_hints(LearnerConfig)[f.name]), f.name
    cfg = to_dataclass(cls, {"train": {"eval_every": 3, "peak_flops": 1e12, "progress": False,
                                       "compilation_cache": "/tmp/cc", "steps": 5}})
    assert (cfg.train.eval_every, cfg.train.peak_flops, cfg.train.progress, cfg.train.compilation_cache) == \
        (3, 1e12, False, "/tmp/cc")
    assert cfg.learner == {"SftConfig": "sft", "RLConfig": "rl"}[cls.__name__]


def test_a_loop_field_is_checked_in_every_learner():
    from vt import VtError
    for cls in (SftConfig, RLConfig):
        with pytest.raises(VtError, match=r"train.eval_every"):
            to_dataclass(cls, {"train": {"eval_every": -1}})
