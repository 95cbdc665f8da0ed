"""Verifiable rewards: math, sandboxed code, STEM, instruction rules, rubric judges, Long2Short shaping.

Every reward function maps a batch of (record, completion) to ``RewardResult``s (base.py). Import the concrete
ones from their modules, or build one by domain name with ``vt.rewards.registry.make_reward``. Like every vt
package this one re-exports nothing (see vt/checkpoint/__init__.py for why).
"""
