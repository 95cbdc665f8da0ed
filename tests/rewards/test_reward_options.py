"""Typed reward options (vt.rewards.registry): one spelling per option, refused at config load when unknown,
misplaced or out of range, and each domain built with its own options."""
from __future__ import annotations

import importlib

import pytest

from vt.cli import main
from vt.rewards.registry import (DOMAINS, MathConfig, RewardsConfig, StemConfig, make_reward, takes,
                                 with_options)


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domain_names_its_reward_class(domain):
    options = getattr(RewardsConfig(), domain)
    module, _, cls = options.reward.rpartition(".")
    assert getattr(importlib.import_module(module), cls).domain == domain
    assert options.timeout is None or takes(domain, options.timeout)


def test_stem_gets_its_own_options_not_the_math_defaults():
    rewards = RewardsConfig(math=MathConfig(workers=1), stem=StemConfig(workers=3, deadline_s=7.0))
    with make_reward("stem", rewards) as stem:
        assert stem.workers == 3
        assert stem.score_one("x^2 + 1", "\\boxed{1 + x^2}").score == 1.0  # math-verify, in stem's own pool
        assert (stem._math.config.workers, stem._math.config.deadline_s) == (3, 7.0)


def test_with_options_sets_workers_where_a_domain_takes_them():
    r = with_options(RewardsConfig(), workers=5, mode=None)
    assert [getattr(r, d).workers for d in DOMAINS if takes(d, "workers")] == [5, 5, 5, 5]
    assert not takes("instruct", "workers") and r.instruct == RewardsConfig().instruct


def write_config(tmp_path, rewards: dict):
    path = tmp_path / "cfg.py"
    path.write_text(f"import ml_collections\n\ndef get_config(arg=None):\n"
                    f"    return ml_collections.ConfigDict({{'rewards': {rewards!r}}})\n")
    return str(path)


@pytest.mark.parametrize("rewards, message", [
    ({"code": {"wokers": 3}}, "config.rewards.code: unknown field(s) config.rewards.code.wokers"),
    ({"math": {"test_time_limit_s": 3.0}}, "config.rewards.math: unknown field(s) config.rewards.math.test_time_limit_s"),
    ({"stem": {"math": {"workers": 2}}}, "config.rewards.stem: unknown field(s) config.rewards.stem.math"),
    ({"maths": {"workers": 2}}, "config.rewards: unknown field(s) config.rewards.maths"),
    ({"code": {"workers": 0}}, "config.rewards.code.workers: must be >= 1 and <= 256, got 0"),
    ({"math": {"deadline_s": 1e308}}, "config.rewards.math.deadline_s: must be > 0 and <= 3600"),
    ({"instruct": {"mode": "lax"}}, "config.rewards.instruct.mode: must be 'strict' or 'loose'"),
    ({"rubric": {"workers": "8"}}, "config.rewards.rubric.workers: expected int"),
])
@pytest.mark.parametrize("command", [("eval", "--out"), ("self-distill", "--workdir")])
def test_a_bad_option_is_refused_at_config_load_naming_the_field(tmp_path, capsys, command, rewards, message):
    rc = main([command[0], "--config", write_config(tmp_path, rewards), command[1], str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("domain, flags, message", [
    ("instruct", ["--workers", "2"], "--workers: --domain instruct takes no such option"),
    ("instruct", ["--timeout", "3"], "--timeout: --domain instruct takes no such option"),
    ("math", ["--mode", "loose"], "--mode: --domain math takes no such option"),
    ("stem", ["--allow-unsandboxed"], "--allow-unsandboxed: --domain stem takes no such option"),
    ("code", ["--judge-url", "http://127.0.0.1:9/v1"], "--judge-url: --domain code takes no such option"),
])
def test_vt_reward_refuses_a_flag_its_domain_does_not_take(tmp_path, capsys, domain, flags, message):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"completion": "x", "ground_truth": "1"}\n')
    rc = main(["reward", "--domain", domain, "--input", str(inp), "--out", str(tmp_path / "out.jsonl"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out.jsonl").exists()

