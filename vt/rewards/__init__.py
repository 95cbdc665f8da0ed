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



def __getattr__(name: str):
    # Long2Short is jax.numpy; import it only when asked so `vt reward` and the CLI stay light.
    if name == "long2short":
        from vt.rewards.shaping import long2short

        return long2short
    raise AttributeError(f"module 'vt.rewards' has no attribute {name!r}")


__all__ = [
    "long2short",
    "DOMAINS",
    "FAILURE_KINDS",
    "RewardFunction",
    "RewardResult",
    "RewardSpecError",
    "make_reward",
    "scores_and_mask",
]
