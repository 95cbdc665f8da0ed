"""LiveCodeBench v6 style code generation (sandboxed unit tests, all must pass): avg@8.

Rows: {"prompt": ..., "tests": [{"input", "output"} | {"fn_name", "args", "expected"}], "ability": "code"}, or
LiveCodeBench's own rows as they come ({"question_content", "public_test_cases", "private_test_cases",
"metadata"}); HumanEval, MBPP and verl code rows are read too (vt.rewards.code.formats.code_tests).

    vt eval --config configs/eval_lcb.py --ckpt DIR --tokenizer DIR --out runs/eval/lcb_v6 \
        --config.data=data/eval/lcb_v6.jsonl
"""
from configs import eval_aime25
from configs.common import parse_arg


def get_config(arg=None):
    parse_arg(arg)
    c = eval_aime25.get_config(None)  # every field is documented there
    c.name = "lcb_v6"
    c.data = "data/eval/lcb_v6.jsonl"
    c.domain = "code"  # last fenced Python block, every test in the sandbox (~6 s per test)
    c.sampling.n = 8  # RECIPE: 8 samples for code
    c.sampling.temperature = 0.6  # RECIPE: the 1.5B work's code evals used 0.6 (set 1.0 for the 3B setting)
    c.ks = (1, 2, 4, 8)
    c.maj_ks = ()  # no votable answer for code
    c.rewards.code.workers = 8  # concurrent sandboxed programs
    return c
