from eval_helpers import aime_rows, math_reward  # noqa: F401  (session fixtures)
