"""A small config with a sweep beside it, for tests/scale/test_launchers.py (launch/sweep.py)."""
import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-4  # peak learning rate
    c.optim.warmup_frac = 0.05  # fraction of steps in warmup
    c.data = ml_collections.ConfigDict()
    c.data.seed = 0  # shuffle seed
    c.data.train = "data/*.jsonl"  # training files
    return c


def get_sweep(arg=None):
    if arg == "list":
        return [{"optim.lr": 1e-5}, {"name": "long warmup", "optim.lr": 3e-5, "optim.warmup_frac": 0.1,
                                     "data.train": "other/*.jsonl"}]
    if arg == "bad":
        return {"optim.lr": [1e-5], "optim.learning_rate": [1e-4]}
    if arg == "badtype":
        return [{"optim.lr": 1e-5}, {"data.seed": "zero"}]
    return {"optim.lr": [1e-5, 3e-5], "data.seed": [0, 1]}
