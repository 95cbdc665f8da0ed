"""MGPO STEM RL (RECIPE stage 3, last phase: numeric answers and option matching).

    vt train --config configs/mgpo_stem.py --workdir runs/mgpo_stem
    vt train --config configs/mgpo_stem.py:smoke --workdir /tmp/mgpo_stem_smoke

Everything else is configs/mgpo_math.py; only the fields below differ.
"""
from configs import mgpo_math
from configs.common import parse_arg


def get_config(arg=None):
    smoke = parse_arg(arg, "smoke") == "smoke"
    c = mgpo_math.get_config(arg)
    c.rewards.stem.rel_tol = 1e-2  # numeric answers: 1% relative tolerance (answers are often rounded)
    if smoke:
        c.data.train = c.data.eval = str(mgpo_math.SMOKE_DATA / "stem.jsonl")
        c.data.domain = "stem"
        return c
    c.model.init_checkpoint = "runs/mgpo_code/final"  # the previous phase (code RL)
    c.data.train = "data/rl/stem.parquet"  # numeric and multiple-choice science questions
    c.data.eval = "data/eval/gpqa_diamond.jsonl"  # held-out multiple choice (A-D)
    c.data.domain = "stem"  # reward: option letter or number within tolerance
    c.data.profile = "runs/profile/stem.jsonl"  # re-profiled at this phase's start: p in {0, 1} dropped
    return c
