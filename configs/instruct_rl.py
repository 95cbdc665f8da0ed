"""MGPO instruct RL (RECIPE stage 5: rule-based constraint rewards and rubric judge rewards).

    vt train --config configs/instruct_rl.py --workdir runs/instruct_rl
    vt train --config configs/instruct_rl.py:smoke --workdir /tmp/instruct_rl_smoke

Everything else is configs/mgpo_math.py; only the fields below differ.
"""
from configs import mgpo_math
from configs.common import parse_arg


def get_config(arg=None):
    smoke = parse_arg(arg, "smoke") == "smoke"
    c = mgpo_math.get_config(arg)
    # Instruct RL (RECIPE stage 5) mixes two rewards in one run, chosen per record by its `domain`:
    # "instruct" (rule-based constraints, partial credit = fraction met) and "rubric" (a judge model).
    c.data.domain = ""  # "" = each record's own domain
    c.rewards.instruct.mode = "strict"  # strict IFEval-style checking during RL (loose for evaluation only)
    # IFEval's quirk off for RL: text in which langdetect finds no language ("12345") would otherwise satisfy
    # "answer in Russian" and the English-case constraints, a reward hack (vt.rewards.instruct.InstructConfig).
    c.rewards.instruct.ifeval_quirks = False
    if smoke:
        c.data.train = c.data.eval = str(mgpo_math.SMOKE_DATA / "instruct.jsonl")
        return c
    c.model.init_checkpoint = "runs/self_distill/final"  # after offline self-distillation
    c.data.train = "data/rl/instruct.jsonl"  # constrained prompts (domain instruct) + open prompts (domain rubric)
    c.data.eval = "data/eval/ifeval.jsonl"
    c.data.profile = ""  # rubric scores are graded, not pass/fail: no 0/1 filtering
    c.rewards.rubric.judge_url = "http://127.0.0.1:8000/v1/chat/completions"  # any OpenAI-compatible judge endpoint
    c.rewards.rubric.judge_model = "judge"  # model name at that endpoint
    c.rewards.rubric.judge_api_key_env = "JUDGE_API_KEY"  # environment variable holding the key ("" = none)
    c.rewards.rubric.workers = 16  # requests in flight
    return c
