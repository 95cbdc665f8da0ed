"""Every learner's config declares the sections the shared set-up and loop read (vt.train.loop.LearnerConfig),
with the protocol's types: a section added to the protocol, or renamed or retyped in one learner, fails here."""
import dataclasses
import typing

import pytest

from vt.rl.learner import RLConfig
from vt.train.loop import LearnerConfig, LoopTrainSection
from vt.train.sft import SftConfig


def _mismatches(cls, protocol, where: str) -> list[str]:
    declared = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    out = []
    for name, want in typing.get_type_hints(protocol).items():
        have = declared.get(name)
        if name not in fields:
            out.append(f"{where}.{name}: not declared")
        elif getattr(want, "_is_protocol", False):
            out += _mismatches(have, want, f"{where}.{name}")
        elif typing.get_origin(have) is typing.Annotated:  # Annotated[int, AT_LEAST_1]: the type is int
            out += [] if typing.get_args(have)[0] is want else [f"{where}.{name}: {have}, not {want}"]
        elif have is not want:
            out.append(f"{where}.{name}: {have}, not {want}")
    return out


@pytest.mark.parametrize("cls", [SftConfig, RLConfig])
def test_learner_configs_declare_the_learner_config_protocol(cls):
    assert _mismatches(cls, LearnerConfig, cls.__name__) == []
    assert LoopTrainSection in typing.get_type_hints(LearnerConfig).values()


def test_the_check_names_a_missing_or_mistyped_field():
    @dataclasses.dataclass(frozen=True)
    class Train:
        eval_every: str = ""
        progress: bool = True
        compilation_cache: str = ""

    @dataclasses.dataclass(frozen=True)
    class Partial:
        learner: str = "x"
        train: Train = Train()

    bad = _mismatches(Partial, LearnerConfig, "Partial")
    assert "Partial.train.eval_every: <class 'str'>, not <class 'int'>" in bad
    assert "Partial.train.peak_flops: not declared" in bad and "Partial.mesh: not declared" in bad
    assert "Partial.learner: not declared" not in bad
