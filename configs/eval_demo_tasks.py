"""The demo's held-out synthetic tasks (vt.data.tasks, written by `vt demo`'s data stage into demo_out/data/), one
domain per variant: the evaluation the demo's eval stage runs, sized for a CPU (64 prompts, 4 samples of 40 tokens).

Run (after `make demo`; the variant names the domain: math (the default), code, stem, instruct):

    vt eval --config configs/eval_demo_tasks.py:math --ckpt demo_out/final --tokenizer demo_out/export/hf \
        --out demo_out/my_eval/math

The data path is relative to the directory vt runs in; another demo work directory:
`--config.data=OTHER/data/heldout_math.jsonl`.
"""
from configs import eval_aime25
from configs.common import parse_arg

DOMAINS = ("math", "code", "stem", "instruct")


def get_config(arg=None):
    domain = parse_arg(arg, *DOMAINS) or DOMAINS[0]
    c = eval_aime25.get_config(None)  # every field of an eval config, at AIME's values; the demo's changes below
    c.name = f"demo_{domain}"  # label in the summary table and plot
    c.data = f"demo_out/data/heldout_{domain}.jsonl"  # chat prompts + ground truth (tests, constraints) per line
    c.domain = domain
    c.limit = 0  # all 64 held-out prompts
    c.sampling.n = 4
    c.sampling.top_p = 1.0
    c.sampling.max_new_tokens = 40  # the demo's answers are short
    c.sampling.batch_size = 128
    c.ks = (1, 4)
    c.maj_ks = (4,) if domain in ("math", "stem") else ()  # a majority vote needs comparable final answers
    c.chunk_problems = 64
    c.model.dtype = "float32"
    return c
