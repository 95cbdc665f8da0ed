"""What config files share: variant parsing, the sampler and rewards sections."""
import dataclasses

import ml_collections

from vt.rewards.registry import RewardsConfig
from vt.rl.opd import OpdConfig
from vt.sampling.config import SamplerConfig
from vt.tracking import logging_defaults


def parse_arg(arg: str | None, *variants: str) -> str:
    """The variant after `file.py:` ("" for none); ValueError (named by vt.config.load_config) for any other."""
    arg = arg or ""
    if arg and arg not in variants:
        raise ValueError(f"unknown variant {arg!r}; known: {', '.join(variants) or '(none)'}")
    return arg


def logging_section() -> ml_collections.ConfigDict:
    """A `logging` section (vt.tracking.LoggingConfig: W&B project, entity, run name, group, tags, mode), every
    field at its default (W&B off), so each can be set with --config.logging.<field>=VALUE."""
    return ml_collections.ConfigDict(logging_defaults())


def rewards_section() -> ml_collections.ConfigDict:
    """A `rewards` section (vt.rewards.registry.RewardsConfig, where every option is documented): each domain's
    options at their defaults, so each can be set with --config.rewards.<domain>.<option>=VALUE."""
    return ml_collections.ConfigDict(dataclasses.asdict(RewardsConfig()))


def opd_section() -> ml_collections.ConfigDict:
    """An `opd` section (vt.rl.opd.OpdConfig: on-policy distillation's teacher and coefficients, documented there),
    every field at its default (off: no teacher), so each can be set with --config.opd.<field>=VALUE."""
    return ml_collections.ConfigDict(dataclasses.asdict(OpdConfig()))


def sampler(**values) -> ml_collections.ConfigDict:
    """A sampler section: every vt.sampling.SamplerConfig field (documented there) at its default, `values` set.

    Every field is declared, so each can be overridden from the command line; a new sampler setting needs only
    its SamplerConfig field."""
    c = ml_collections.ConfigDict(dataclasses.asdict(SamplerConfig()))
    for name, value in values.items():
        if name not in c:
            raise KeyError(f"SamplerConfig has no field {name!r}")
        c[name] = value
    return c
