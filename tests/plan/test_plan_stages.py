"""Which programs `vt plan` compiles for each kind of config (built, not compiled: no libtpu needed)."""
import jax

from vt.config import load_config
from vt.plan.run import Stage, stages
from vt.recipe.stages import STAGE_NAMES

RL = ["prefill", "decode", "old_logps", "update", "apply"]


def test_recipe_stages_in_order_with_their_programs():
    st = stages(load_config("configs/demo.py").to_dict(), jax.devices()[:1], 16 * 10 ** 9)
    by = {}  # the programs of each stage, an RL phase's profiling apart (its programs' stage is rl_*.profile)
    for p in (p for s in st for p in s.programs):
        by.setdefault(p.stage, []).append(p)
    st = [Stage(name, progs) for name, progs in by.items()]
    names = [s.name for s in st]
    assert names[-1] == "probe"  # the held-out table's sampler (config.probe.data is set in the demo)
    order = [STAGE_NAMES.index(n.split(".")[0]) for n in names[:-1]]
    assert order == sorted(order) and {"sft1", "rl_math", "rl_math.profile", "self_distill.distill"} <= set(names)
    for s in st:
        progs = [p.name for p in s.programs]
        base = s.name.split(".")[0]
        expect = (["train_step"] if base.startswith("sft") or s.name == "self_distill.sft" else
                  ["prefill", "decode", "scorer"] if s.name == "self_distill.distill" else
                  ["prefill", "decode"] if s.name.endswith(".profile") else
                  RL if base.startswith("rl_") or base == "long2short" else ["prefill", "decode"])
        assert progs == expect, (s.name, progs)
        assert all(p.fixes for p in s.programs)
    # an RL phase's profiling (profile_k > 0) comes right before the phase
    assert names.index("rl_math.profile") + 1 == names.index("rl_math")


def test_single_stage_configs():
    d = jax.devices()[:1]
    assert [p.name for s in stages(load_config("configs/sft_stage1.py:smoke").to_dict(), d, 10 ** 10)
            for p in s.programs] == ["train_step"]
    assert [p.name for s in stages(load_config("configs/mgpo_math.py:smoke").to_dict(), d, 10 ** 10)
            for p in s.programs] == RL
