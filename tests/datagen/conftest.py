import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))  # the shared stand-in model

from eval_helpers import aime_rows, math_reward  # noqa: E402, F401  (session fixtures)
