"""The learners `vt train` runs, by a config's top-level `learner` field: each its config class and its entry.

One floor above vt.train and vt.rl (the RL learner builds on vt.train's loop), so neither names the other; a new
learner is one entry here. (The command, vt.learners.commands, imports this only when it runs.)
"""
from vt.rl.learner import RLConfig, train_rl
from vt.train.sft import SftConfig, train

LEARNERS = {"sft": (SftConfig, train), "rl": (RLConfig, train_rl)}
