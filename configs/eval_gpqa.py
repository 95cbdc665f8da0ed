"""GPQA-Diamond style multiple choice (STEM reward: option letters A-J, numeric tolerance): avg@16.

Rows: {"prompt": question with the lettered options, "ground_truth": "C", "ability": "stem"} (JSONL/parquet).

    vt eval --config configs/eval_gpqa.py --ckpt DIR --tokenizer DIR --out runs/eval/gpqa \
        --config.data=data/eval/gpqa_diamond.jsonl
"""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("eval_base", pathlib.Path(__file__).with_name("eval_aime25.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config(arg=None):
    c = _base.get_config("smoke" if arg == "smoke" else None)  # every field is documented there
    if arg not in (None, "", "smoke"):
        raise ValueError(f"unknown variant {arg!r}; known: smoke")
    c.name = "gpqa"
    c.domain = "stem"  # option letter (or number with tolerance) from the answer region
    c.clr.enabled = False
    if arg == "smoke":
        return c
    c.data = "data/eval/gpqa_diamond.jsonl"
    c.system_prompt = ""
    c.prompt_suffix = "\n\nAnswer with the letter of the correct option in \\boxed{}."
    c.sampling.n = 16  # RECIPE: 16 samples for GPQA
    c.ks = (1, 4, 16)
    c.maj_ks = (16,)
    return c
