"""Final-answer extraction per domain, for majority vote and CLR clustering (scoring is vt.rewards').

math: the last complete ``\\boxed{}`` after ``</think>`` (the math reward's extractor, so votes and scores
agree). stem: the chosen option letter, else the last boxed answer. code and instruct have no votable
answer (None): their maj@k is not reported.
"""
from __future__ import annotations

from vt.rewards.base import answer_region
from vt.rewards.math_reward import boxed_answers
from vt.rewards.stem import chosen_options

VOTABLE_DOMAINS = ("math", "stem")


def extract_answer(domain: str, completion: str, tail_chars: int = 2000) -> str | None:
    region = answer_region(completion, tail_chars)
    if domain == "stem":
        options = chosen_options(region)
        if len(options) == 1:
            return options[0]
    if domain in VOTABLE_DOMAINS:
        boxes = boxed_answers(region)
        return boxes[-1].strip() if boxes else None
    return None


def math_equivalence(reward) -> "callable":
    """``equivalent(a, b)`` through a MathReward's killable math-verify workers (a checked as the gold).

    A verifier error (timeout) counts as *not* equivalent: two answers are merged only on a positive
    verdict, so an unknown never inflates a cluster.
    """

    def equivalent(a: str, b: str) -> bool:
        return reward.verify(a, b).score == 1.0

    return equivalent
