"""Which programs `vt plan` compiles for each kind of config (built, not compiled: no libtpu needed)."""
import jax

from vt.config import load_config
from vt.plan.run import stages
from vt.recipe.stages import STAGE_NAMES

RL = ["prefill", "decode", "old_logps", "update", "apply"]


def test_recipe_stages_in_order_with_their_programs():
    st = stages(load_config("configs/demo.py").to_dict(), jax.devices()[:1], 16 * 10 ** 9)
    names = [s.name for s in st]
    order = [STAGE_NAMES.index(n.split(".")[0]) for n in names]
    assert order == sorted(order) and {"sft1", "rl_math", "self_distill.distill"} <= set(names)
    for s in st:
        progs = [p.name for p in s.programs]
        base = s.name.split(".")[0]
        expect = (["train_step"] if base.startswith("sft") or s.name == "self_distill.sft" else
                  ["prefill", "decode", "scorer"] if s.name == "self_distill.distill" else
                  RL if base.startswith("rl_") or base == "long2short" else ["prefill", "decode"])
        assert progs == expect, (s.name, progs)
        assert all(p.fix for p in s.programs)


def test_single_stage_configs():
    d = jax.devices()[:1]
    assert [p.name for s in stages(load_config("configs/sft_stage1.py:smoke").to_dict(), d, 10 ** 10)
            for p in s.programs] == ["train_step"]
    assert [p.name for s in stages(load_config("configs/mgpo_math.py:smoke").to_dict(), d, 10 ** 10)
            for p in s.programs] == RL
