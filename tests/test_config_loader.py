"""vt/config.py: config files, typed command-line overrides and the dataclass boundary."""
import dataclasses

import pytest

from vt import VtError
from vt.config import load_config, to_dataclass


def test_variant_and_typed_overrides():
    c = load_config("configs/mgpo_math.py:smoke", ["--config.optim.lr=2e-4", "--config.rollout.group_size=3",
                                                   "--config.data.domain=stem", "--config.train.progress=True"])
    assert c.optim.lr == 2e-4 and c.rollout.group_size == 3 and c.data.domain == "stem"
    assert c.model.preset == "tiny"  # the :smoke variant
    assert isinstance(load_config("configs/mgpo_math.py", ["--config.optim.lr=1"]).optim.lr, float)


@pytest.mark.parametrize("override,needle", [
    ("--config.optim.nope=1", "optim.nope"),
    ("--config.nope.lr=1", "'nope'"),
    ("--config.rollout.group_size=abc", "rollout.group_size"),
    ("--config.rollout.group_size=1.5", "expected int"),
    ("--config.train.progress=1", "expected bool"),
    ("--config.optim.lr", "VALUE"),
])
def test_bad_overrides_name_the_field(override, needle):
    with pytest.raises(VtError, match=needle):
        load_config("configs/mgpo_math.py", [override])


def test_missing_file_and_unknown_variant():
    with pytest.raises(VtError, match="not found"):
        load_config("configs/nope.py")
    with pytest.raises(VtError, match="variant"):
        load_config("configs/mgpo_math.py:nope")


@dataclasses.dataclass(frozen=True)
class Inner:
    x: int = 1


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner = Inner()
    name: str = "a"
    ratio: float = 0.5


def test_to_dataclass_boundary():
    out = to_dataclass(Outer, {"inner": {"x": 3}, "ratio": 1})
    assert out == Outer(Inner(3), "a", 1.0)
    with pytest.raises(VtError, match="config.inner.y"):
        to_dataclass(Outer, {"inner": {"y": 3}})
    with pytest.raises(VtError, match="config.name"):
        to_dataclass(Outer, {"name": 3})


def _undeclared(dc, cfg, prefix=""):
    """Fields of dataclass `dc` (recursively) that the config dict does not declare."""
    import typing
    hints, out = typing.get_type_hints(dc), []
    for f in dataclasses.fields(dc):
        if f.name not in cfg:
            out.append(prefix + f.name)
        elif dataclasses.is_dataclass(hints[f.name]):
            out += _undeclared(hints[f.name], cfg[f.name], f"{prefix}{f.name}.")
    return out


@pytest.mark.parametrize("spec", ["sft_stage1", "sft_stage2", "mgpo_math", "mgpo_code", "mgpo_stem", "long2short",
                                  "instruct_rl", "eval_aime25", "eval_gpqa", "eval_ifeval", "eval_lcb",
                                  "self_distill"])
def test_stage_configs_declare_every_setting(spec):
    """Overrides can only set fields a config file declares, so every learner/eval setting must be in it (a
    missing one, like mgpo.dynamic_sampling_rounds once was, cannot be swept or set from the command line)."""
    from vt.distill.run import SelfDistillConfig
    from vt.eval.runner import EvalConfig
    from vt.rl.learner import RLConfig
    from vt.train.sft import SftConfig
    dc = (SftConfig if spec.startswith("sft") else EvalConfig if spec.startswith("eval") else
          SelfDistillConfig if spec == "self_distill" else RLConfig)
    assert _undeclared(dc, load_config(f"configs/{spec}.py")) == []
