"""`train_rl(rl_config(task, **overrides), workdir)` in a process of its own, for the tests that need one (another
device count, a SIGKILL): python tests/rl/rl_worker.py SPEC_JSON WORKDIR, SPEC_JSON = {"task": {name: path},
"overrides": {dotted field: value}} (rl_helpers.run_rl_process writes it)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_helpers import rl_config  # noqa: E402
from vt.rl.learner import train_rl  # noqa: E402

spec = json.loads(sys.argv[1])
train_rl(rl_config({k: Path(v) for k, v in spec["task"].items()}, **spec["overrides"]), sys.argv[2])
