"""The reward domains and their options, typed: ``RewardsConfig`` is a config's ``rewards`` section (RL, eval,
self-distillation: ``rewards.code.workers``), and what `vt reward` and `vt data distill` build from their flags. An
unknown, misplaced or out-of-range option is refused when the config loads, naming the field (vt.config).

No reward is imported here: ``make_reward`` imports only the domain's module. A new domain: a RewardFunction taking
``config=`` in its own module, its options class here (``reward`` names the class), its field in RewardsConfig.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Annotated, ClassVar, Literal

from vt.rewards.base import RewardFunction
from vt.validation import AT_LEAST_1, NON_NEGATIVE, POSITIVE, FieldError, Range, check_fields

# Seconds: an hour at most (a deadline of 1e308 s overflows the wait and made every item a verifier error).
SECONDS = Range(gt=0, le=3600)
# Each worker is a process (math: an interpreter with sympy, ~150 MB), a sandbox or a request; more is a typo.
WORKERS = Range(ge=1, le=256)


class _Checked:
    def __post_init__(self):
        check_fields(self)  # the Range each field is annotated with


@dataclasses.dataclass(frozen=True)
class MathConfig(_Checked):
    reward: ClassVar[str] = "vt.rewards.math_reward.MathReward"
    timeout: ClassVar[str] = "deadline_s"  # the option `vt reward --timeout` sets
    workers: Annotated[int, WORKERS] = 2  # math-verify worker processes = concurrent verifications
    deadline_s: Annotated[float, SECONDS] = 15.0  # hard wall-clock limit per item; the worker is killed beyond it
    verify_timeout_s: Annotated[int, Range(ge=1, le=3600)] = 4  # math-verify's own SIGALRM timeout per call
    tail_chars: Annotated[int, Range(ge=16)] = 2000  # only this many trailing characters of the answer are scored
    worker_memory_mb: Annotated[int, AT_LEAST_1] = 2048  # a worker's address-space cap (huge sympy integers hit it)
    startup_timeout_s: Annotated[float, POSITIVE] = 120.0  # a worker's imports (sympy, antlr) on a loaded machine



@dataclasses.dataclass(frozen=True)
class CodeConfig(_Checked):
    reward: ClassVar[str] = "vt.rewards.code.reward.CodeReward"
    timeout: ClassVar[str] = "test_time_limit_s"
    workers: Annotated[int, WORKERS] = 2  # problems graded concurrently (each runs its tests one after another)
    test_time_limit_s: Annotated[float, SECONDS] = 6.0  # wall clock per test run, interpreter start-up included
    problem_time_limit_s: Annotated[float, POSITIVE] = 60.0  # budget for all of a problem's tests
    memory_bytes: Annotated[int, AT_LEAST_1] = 2 << 30
    output_bytes: Annotated[int, AT_LEAST_1] = 16 << 20
    file_bytes: Annotated[int, AT_LEAST_1] = 64 << 20
    tmp_bytes: Annotated[int, AT_LEAST_1] = 64 << 20
    nproc: Annotated[int, AT_LEAST_1] = 64
    python: str | None = None  # interpreter inside the sandbox; default: the system python3
    allow_unsandboxed: bool = False  # run WITHOUT isolation when bwrap is unavailable (warns loudly)
    pool: bool = True  # warm sandboxes (sandbox/warm.py); False: a cold sandbox per test run (for comparison)



@dataclasses.dataclass(frozen=True)
class StemConfig(_Checked):
    reward: ClassVar[str] = "vt.rewards.stem.StemReward"
    timeout: ClassVar[str] = "deadline_s"
    rel_tol: Annotated[float, NON_NEGATIVE] = 1e-2  # numeric answers (often rounded to 3 significant figures)
    abs_tol: Annotated[float, NON_NEGATIVE] = 1e-8
    tail_chars: Annotated[int, Range(ge=16)] = 2000
    # Expression-valued ground truths go to math-verify: its worker processes and per-item deadline (MathConfig).
    workers: Annotated[int, WORKERS] = 2
    deadline_s: Annotated[float, SECONDS] = 15.0



@dataclasses.dataclass(frozen=True)
class InstructConfig:
    reward: ClassVar[str] = "vt.rewards.instruct.InstructReward"
    timeout: ClassVar[None] = None
    mode: Literal["strict", "loose"] = "strict"  # which verdicts the score uses
    # IFEval counts a response in which langdetect finds no language (only digits or punctuation) as
    # satisfying the language and English-case constraints. True reproduces that; False fails it (a
    # reward hack in RL: "12345" would satisfy "answer in Russian").
    ifeval_quirks: bool = True

    def __post_init__(self):
        if self.mode not in ("strict", "loose"):
            raise FieldError(type(self).__name__, "mode", f"must be 'strict' or 'loose', got {self.mode!r}")


@dataclasses.dataclass(frozen=True)
class RubricConfig(_Checked):
    """An OpenAI-compatible judge endpoint (vt.rewards.rubric.OpenAIChatJudge); a judge callable is given to
    RubricReward itself."""

    reward: ClassVar[str] = "vt.rewards.rubric.RubricReward"
    timeout: ClassVar[str] = "timeout_s"
    judge_url: str = ""  # API base (http://host:8000/v1) or the full .../chat/completions URL
    judge_model: str = ""
    judge_api_key_env: str = ""  # the environment variable holding the API key ("" = none)
    # Judge requests in flight. A served judge (vLLM, SGLang) batches dozens of requests at once, and a step's batch
    # is one burst of them: 8 made the judge's rounds (not its latency) the step's time and queued an asynchronous
    # learner's batch ahead behind the current one's (bench/rl_step.py --async judge). A smaller server: lower it.
    workers: Annotated[int, WORKERS] = 64
    timeout_s: Annotated[float, SECONDS] = 120.0  # per request
    max_retries: Annotated[int, NON_NEGATIVE] = 5
    backoff_s: Annotated[float, NON_NEGATIVE] = 1.0
    max_backoff_s: Annotated[float, NON_NEGATIVE] = 60.0
    temperature: Annotated[float, NON_NEGATIVE] = 0.0
    max_tokens: Annotated[int, AT_LEAST_1] = 1024
    cache_entries: Annotated[int, NON_NEGATIVE] = 100_000  # verdicts kept, keyed by (judge, prompt, response)



@dataclasses.dataclass(frozen=True)
class RewardsConfig:
    math: MathConfig = MathConfig()
    code: CodeConfig = CodeConfig()
    stem: StemConfig = StemConfig()
    instruct: InstructConfig = InstructConfig()
    rubric: RubricConfig = RubricConfig()


# The one list of reward domains (`vt reward --domain` offers these).
DOMAINS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RewardsConfig))


def make_reward(domain: str, rewards: RewardsConfig = RewardsConfig()) -> RewardFunction:
    """Build the reward function for ``domain`` with its options from ``rewards``."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown reward domain {domain!r}; expected one of {sorted(DOMAINS)}")
    options = getattr(rewards, domain)
    module, _, cls = options.reward.rpartition(".")
    return getattr(importlib.import_module(module), cls)(config=options)


def with_options(rewards: RewardsConfig, **options) -> RewardsConfig:
    """``rewards`` with each option that is not None set in every domain that takes it (``workers=4``: math,
    code, stem, rubric)."""
    return dataclasses.replace(rewards, **{
        d: dataclasses.replace(getattr(rewards, d), **{k: v for k, v in options.items() if v is not None and takes(d, k)})
        for d in DOMAINS})


def takes(domain: str, option: str) -> bool:
    return option in {f.name for f in dataclasses.fields(getattr(RewardsConfig, domain))}
