"""SFT stage 2 (RECIPE): from stage 1's final (merged) checkpoint, same hyperparameters, 2 epochs on the hard
subset: traces of at least 5K tokens whose prompts a reference model gets wrong in >= 75% of 8 rollouts.

Run (stage 1 merged into runs/sft_stage1/merged; pass rates profiled into runs/profile/pass_rates.jsonl):

    vt train --config configs/sft_stage2.py --workdir runs/sft_stage2

Smoke test on CPU:

    vt train --config configs/sft_stage2.py:smoke --workdir /tmp/sft2_smoke

Every field not set here is stage 1's (configs/sft_stage1.py documents each one).
"""
from configs import sft_stage1
from configs.common import parse_arg


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = sft_stage1.get_config(None)
    c.model.init_checkpoint = "runs/sft_stage1/merged"  # stage 1's Diversity-Exploring Distillation merge
    c.data.num_epochs = 2.0  # RECIPE: 2 epochs on the hard subset
    c.data.seed = 1  # a different shuffle from stage 1
    c.data.num_shards = 8  # logical data shards, as stage 1: keep it fixed for the run (resume on any host count)
    c.data.hard_subset.pass_rates = "runs/profile/pass_rates.jsonl"  # one JSON line per prompt id (RL profiler)
    c.data.hard_subset.min_trace_tokens = 5000  # RECIPE: traces of at least 5K tokens
    c.data.hard_subset.min_error_rate = 0.75  # RECIPE: reference errs in >= 75% of rollouts
    c.data.hard_subset.min_rollouts = 8  # RECIPE: 8 rollouts per prompt
    c.checkpoint.every = 100  # fewer steps than stage 1: save more often for the specialist pool
    if variant == "smoke":
        c = sft_stage1.smoke(c)
        c.data.hard_subset.pass_rates = ""  # the synthetic task has no profile
    return c
