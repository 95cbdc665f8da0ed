"""GPQA-Diamond style multiple choice (STEM reward: option letters A-J, numeric tolerance): avg@16.

Rows: {"prompt": question with the lettered options, "ground_truth": "C", "ability": "stem"} (JSONL/parquet).

    vt eval --config configs/eval_gpqa.py --ckpt DIR --tokenizer DIR --out runs/eval/gpqa \
        --config.data=data/eval/gpqa_diamond.jsonl
"""
from configs import eval_aime25
from configs.common import parse_arg


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = eval_aime25.get_config(variant)  # every field is documented there
    c.name = "gpqa"
    c.domain = "stem"  # option letter (or number with tolerance) from the answer region
    c.clr.enabled = False
    if variant == "smoke":
        return c
    c.data = "data/eval/gpqa_diamond.jsonl"
    c.system_prompt = ""
    c.prompt_suffix = "\n\nAnswer with the letter of the correct option in \\boxed{}."
    c.sampling.n = 16  # RECIPE: 16 samples for GPQA
    c.ks = (1, 4, 16)
    c.maj_ks = (16,)
    return c
