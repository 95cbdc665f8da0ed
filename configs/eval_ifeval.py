"""IFEval style instruction following: prompt- and instruction-level accuracy, strict and loose.

Rows: {"prompt": ..., "constraints": [{"type": ..., ...kwargs}], "ability": "instruct"} (vt.rewards.instruct),
or IFEval's own rows as they come: {"key", "prompt", "instruction_id_list", "kwargs"}.

    vt eval --config configs/eval_ifeval.py --ckpt DIR --tokenizer DIR --out runs/eval/ifeval \
        --config.data=data/eval/ifeval.jsonl
"""
from configs import eval_aime25
from configs.common import parse_arg


def get_config(arg=None):
    parse_arg(arg)
    c = eval_aime25.get_config(None)  # every field is documented there
    c.name = "ifeval"
    c.data = "data/eval/ifeval.jsonl"
    c.domain = "instruct"  # summary adds prompt_strict, inst_strict, prompt_loose, inst_loose
    c.sampling.n = 1  # not published: one sample per prompt, as IFEval reports
    c.ks = (1,)
    c.maj_ks = ()
    return c
