"""Domain name -> reward function. Imports are lazy so picking one domain never loads the others."""
from __future__ import annotations

import importlib
from typing import Any

from vt.rewards.base import RewardFunction

# domain -> (module, class): the one list of reward domains (`vt reward --domain` offers these).
DOMAINS: dict[str, tuple[str, str]] = {
    "math": ("vt.rewards.math_reward", "MathReward"),
    "code": ("vt.rewards.code.reward", "CodeReward"),
    "stem": ("vt.rewards.stem", "StemReward"),
    "instruct": ("vt.rewards.instruct", "InstructReward"),
    "rubric": ("vt.rewards.rubric", "RubricReward"),
}


def make_reward(domain: str, **options: Any) -> RewardFunction:
    """Build the reward function for ``domain`` with its constructor ``options``."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown reward domain {domain!r}; expected one of {sorted(DOMAINS)}")
    module, cls = DOMAINS[domain]
    return getattr(importlib.import_module(module), cls)(**options)
