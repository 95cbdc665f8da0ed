"""Verifiable rewards: math, sandboxed code, STEM, instruction rules, rubric judges, Long2Short shaping.

Every reward function maps a batch of (record, completion) to ``RewardResult``s (see base.py). Import the
concrete ones from their modules, or build one by domain name with ``make_reward``.
"""
from vt.rewards.base import (
    FAILURE_KINDS,
    RewardFunction,
    RewardResult,
    RewardSpecError,
    scores_and_mask,
)
from vt.rewards.registry import DOMAINS, make_reward

__all__ = [
    "DOMAINS",
    "FAILURE_KINDS",
    "RewardFunction",
    "RewardResult",
    "RewardSpecError",
    "make_reward",
    "scores_and_mask",
]
