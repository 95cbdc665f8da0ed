"""Long2Short (RECIPE: end of math RL): correct responses shorter than their group's mean earn up to +0.2.

    vt train --config configs/long2short.py --workdir runs/long2short
    vt train --config configs/long2short.py:smoke --workdir /tmp/l2s_smoke

Everything else is configs/mgpo_math.py; only the fields below differ.
"""
from configs import mgpo_math
from configs.common import parse_arg


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = mgpo_math.get_config(variant)
    c.mgpo.long2short_lambda = 0.2  # RECIPE: lambda = 0.2, zero-sum over the correct responses
    if variant != "smoke":
        c.model.init_checkpoint = "runs/mgpo_math/final"  # the math RL phase's final checkpoint (vt pipeline passes the real path)
        c.data.profile = "runs/profile/long2short.jsonl"  # re-profiled at this phase's start
        c.train.steps = 200  # not published: a short phase at the end of math RL
    return c
