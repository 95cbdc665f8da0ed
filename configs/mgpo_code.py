"""MGPO code RL (RECIPE stage 3: math -> code, unit tests run in the bubblewrap sandbox).

    vt train --config configs/mgpo_code.py --workdir runs/mgpo_code
    vt train --config configs/mgpo_code.py:smoke --workdir /tmp/mgpo_code_smoke

Everything else is configs/mgpo_math.py; only the fields below differ.
"""
from configs import mgpo_math
from configs.common import parse_arg


def get_config(arg=None):
    smoke = parse_arg(arg, "smoke") == "smoke"
    c = mgpo_math.get_config(arg)
    c.rewards.code.workers = 2 if smoke else 16  # problems graded concurrently, each in its own bubblewrap sandbox
    c.rewards.code.test_time_limit_s = 6.0  # LiveCodeBench: about 6 s per test
    c.rewards.code.problem_time_limit_s = 60.0  # all of one problem's tests
    if smoke:
        c.data.train = c.data.eval = str(mgpo_math.SMOKE_DATA / "code.jsonl")
        c.data.domain = "code"
        c.rollout.sampler.max_new_tokens = 32
        return c
    c.model.init_checkpoint = "runs/long2short/final"  # the previous phase (math RL -> Long2Short)
    c.data.train = "data/rl/code.parquet"  # prompts with unit tests (stdin/stdout or call-based)
    c.data.eval = "data/eval/livecodebench_v6.jsonl"  # held-out problems with tests
    c.data.domain = "code"  # reward: last fenced code block passes every test in the sandbox
    c.data.profile = "runs/profile/code.jsonl"  # re-profiled at this phase's start: p in {0, 1} dropped
    return c
