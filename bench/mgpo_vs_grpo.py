"""MGPO (gamma > 0) vs GRPO (gamma = 0) on the same task, seed and starting checkpoint; curves side by side.

    .venv/bin/python bench/mgpo_vs_grpo.py [--steps 30] [--gamma 1.0] [--out bench/out/mgpo_vs_grpo]

The task is the tests' verifiable toy (`a+b` -> `\\boxed{a+b}`, tiny model SFT'd on half-wrong answers), run
through the real sampler and math verifier. It prints held-out accuracy per evaluation for both and writes a
plot. On a toy this says nothing about which wins at scale; it shows both learners work on equal footing.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rl"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("bench/out/mgpo_vs_grpo"))
    args = ap.parse_args()

    from rl_helpers import build_task, metrics, rl_config
    from vt.rl.learner import train_rl

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        task = build_task(Path(tmp) / "task")
        curves = {}
        for name, gamma in (("GRPO", 0.0), (f"MGPO (gamma={args.gamma})", args.gamma)):
            cfg = rl_config(task, **{"mgpo.gamma": gamma, "train.steps": args.steps, "train.eval_every": 5})
            result = train_rl(cfg, Path(tmp) / name.split()[0])
            curves[name] = {"eval": result.eval_history,
                            "train_accuracy": [(r["step"], r["accuracy"]) for r in metrics(Path(tmp) / name.split()[0])
                                               if "accuracy" in r]}
    (args.out / "curves.json").write_text(json.dumps(curves, indent=2))
    print(f"{'step':>5s} " + " ".join(f"{n:>22s}" for n in curves))
    for i, (step, _) in enumerate(next(iter(curves.values()))["eval"]):
        print(f"{step:5d} " + " ".join(f"{c['eval'][i][1]:22.3f}" for c in curves.values()))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for name, c in curves.items():
        ax[0].plot(*zip(*c["eval"]), marker="o", label=name)
        ax[1].plot(*zip(*c["train_accuracy"]), label=name)
    ax[0].set(title="held-out accuracy (avg@4)", xlabel="RL step")
    ax[1].set(title="rollout accuracy", xlabel="RL step")
    ax[0].legend()
    fig.tight_layout()
    fig.savefig(args.out / "curves.png", dpi=100)
    print(f"wrote {args.out / 'curves.png'}")


if __name__ == "__main__":
    main()
