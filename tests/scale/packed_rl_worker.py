"""One process of the 2-process packed-vs-padded RL check (tests/scale/test_multiprocess_rl.py), started by
launch/local.sh: tests/rl/packed_check.check on a (data 2, fsdp 2, tensor 1) mesh over both processes' devices,
each process feeding its half of the groups; process 0 writes the result as JSON to argv[1]."""
import json
import sys
from pathlib import Path

from vt.distributed import initialize

initialize()  # before any device use

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))
from packed_check import check  # noqa: E402

import jax  # noqa: E402

result = check((2, 2, 1))
result["processes"] = jax.process_count()
if jax.process_index() == 0:
    Path(sys.argv[1]).write_text(json.dumps(result))
