"""vt/config.py: config files, typed command-line overrides and the dataclass boundary; every config file
declares every field of the dataclasses it fills."""
import dataclasses
import subprocess
import sys
import typing

import pytest

from testutil import REPO
from vt import VtError
from vt.config import load_config, to_dataclass
from vt.distill.run import SelfDistillConfig
from vt.eval.runner import EvalConfig
from vt.recipe.runner import recipe_config, validate
from vt.recipe.stages import STAGE_BY_NAME, RecipeConfig
from vt.rl.learner import RLConfig
from vt.train.sft import SftConfig


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
    hints, out = typing.get_type_hints(dc), []
    for f in dataclasses.fields(dc):
        if f.name not in cfg:
            out.append(prefix + f.name)
        elif dataclasses.is_dataclass(hints[f.name]):
            out += _undeclared(hints[f.name], cfg[f.name], f"{prefix}{f.name}.")
    return out


def _stage_config_class(spec):
    return (SftConfig if spec.startswith("sft") else EvalConfig if spec.startswith("eval") else
            SelfDistillConfig if spec == "self_distill" else RLConfig)


STAGE_CONFIGS = ["sft_stage1", "sft_stage2", "mgpo_math", "mgpo_code", "mgpo_stem", "long2short", "instruct_rl",
                 "eval_aime25", "eval_gpqa", "eval_ifeval", "eval_lcb", "self_distill"]


@pytest.mark.parametrize("spec", STAGE_CONFIGS)
def test_stage_configs_declare_every_setting(spec):
    """Overrides can only set fields a config file declares, so every learner/eval setting must be in it (a
    missing one cannot be swept or set from the command line)."""
    assert _undeclared(_stage_config_class(spec), load_config(f"configs/{spec}.py")) == []


@pytest.mark.parametrize("spec", ["vibethinker_3b", "vibethinker_1p5b", "demo", "demo:ci", "demo:opd"])
def test_recipe_configs_declare_every_setting_of_every_stage(spec):
    """The recipe's stage sections start from the stage configs; every field of every section (what its Stage
    record says it holds) and of the recipe's own fields (the probe's sampler included) is declared, so any can
    be overridden (--config.stages.rl_math.mgpo.dynamic_sampling_rounds=2)."""
    path, _, variant = spec.partition(":")
    cfg = load_config(f"configs/{path}.py" + (f":{variant}" if variant else ""))
    missing = _undeclared(RecipeConfig, cfg)
    for stage, section in cfg.stages.items():
        kind = STAGE_BY_NAME[stage].section
        for key, dc in (kind.items() if isinstance(kind, dict) else [("", kind)]):
            values, prefix = (section[key], f"stages.{stage}.{key}.") if key else (section, f"stages.{stage}.")
            if typing.get_origin(dc) is dict:  # a mapping of configs: each entry
                item = typing.get_args(dc)[1]
                missing += [m for name, v in values.items() for m in _undeclared(item, v, f"{prefix}{name}.")]
            else:
                missing += _undeclared(dc, values, prefix)
    assert missing == []


def test_a_recipe_override_reaches_a_field_the_stage_config_declares(tmp_path):
    cfg = load_config("configs/demo.py", ["--config.stages.rl_math.mgpo.dynamic_sampling_rounds=2",
                                          "--config.stages.rl_math.train.peak_flops=1e12",
                                          "--config.probe.sampler.top_k=5"])
    resolved = validate(recipe_config(cfg, tmp_path), tmp_path)
    assert resolved["problems"] == []
    rl = resolved["stages"]["rl_math"].rl
    assert rl.mgpo.dynamic_sampling_rounds == 2 and rl.train.peak_flops == 1e12
    bad = recipe_config(load_config("configs/demo.py", ["--config.stages.select.sampler.top_p=0"]), tmp_path)
    assert validate(bad, tmp_path)["problems"] == [
        "config.stages.select: config.stages.select.sampler.top_p: must be > 0 and <= 1, got 0.0"]
    # An RL section's pipeline fields (RLStageConfig) sit beside its learner's and are checked as typed.
    bad = recipe_config(load_config("configs/demo.py", ["--config.stages.rl_math.profile_k=-1"]), tmp_path)
    assert validate(bad, tmp_path)["problems"] == [
        "config.stages.rl_math: config.stages.rl_math.profile_k: must be >= 0, got -1"]


def test_unknown_variant_is_named_with_the_known_ones():
    with pytest.raises(VtError, match=r"demo.py: variant 'nope': unknown variant 'nope'; known: ci"):
        load_config("configs/demo.py:nope")
    with pytest.raises(VtError, match=r"known: \(none\)"):
        load_config("configs/eval_lcb.py:smoke")


@pytest.mark.parametrize("spec", ["configs/instruct_rl.py", "configs/instruct_rl.py:smoke"])
def test_instruct_rl_runs_without_the_ifeval_quirk_and_can_set_it(spec):
    """The production instruct RL fails text with no detectable language on language constraints (IFEval's quirk
    off), in the recipe's stage too; the setting is declared, so an override can turn it back on."""
    from vt.rewards.registry import RewardsConfig, make_reward

    cfg = load_config(spec)
    assert cfg.rewards.instruct.ifeval_quirks is False
    with make_reward("instruct", to_dataclass(RewardsConfig, cfg.rewards)) as reward:
        record = {"constraints": [{"type": "language", "language": "ru"}]}
        assert reward([record], ["12345"])[0].score == 0.0
    assert load_config(spec, ["--config.rewards.instruct.ifeval_quirks=True"]).rewards.instruct.ifeval_quirks is True
    recipe = load_config("configs/vibethinker_3b.py")
    assert recipe.stages.rl_instruct.rewards.instruct.ifeval_quirks is False


def test_loading_a_config_file_imports_no_jax():
    """Config files are host-side (vt.sampling.config, vt.tracking): loading each one, in a fresh process, starts
    neither JAX nor the model. The first file that does is named."""
    files = [str(p) for p in sorted(REPO.glob("configs/*.py")) if "def get_config" in p.read_text()]
    assert len(files) > 10
    code = ("import sys, vt.config\n"
            "for f in sys.argv[1:]:\n"
            "    vt.config.load_config(f)\n"
            "    heavy = [m for m in ('jax', 'flax', 'torch') if m in sys.modules]\n"
            "    assert not heavy, f'{f} imports {heavy}'\n")
    r = subprocess.run([sys.executable, "-c", code, *files], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
