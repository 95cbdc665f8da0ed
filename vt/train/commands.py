"""`vt train` and `vt merge`."""
from __future__ import annotations

import argparse
from pathlib import Path

from vt import EXIT_PREEMPTED, VtError
from vt.checkpoint.seal import add_trust_flag
from vt.validation import check_output_path


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="run or resume SFT or RL from a config (configs/sft_stage1.py, configs/mgpo_math.py, ...)",
                              description="Run the learner the config's top-level `learner` field names: SFT (learner = 'sft': "
                                          "configs/sft_*.py) or MGPO RL (learner = 'rl': configs/mgpo_*.py, "
                                          "long2short.py, instruct_rl.py); "
                                          "a workdir with checkpoints resumes from the newest one. "
                                          "Override any field with --config.key=value. On SIGTERM it saves a "
                                          f"checkpoint and exits with status {EXIT_PREEMPTED} (re-run to resume); "
                                          "a SIGTERM while it is stopping, or a second one, ends it at once. A full "
                                          "disk stops it with one line and exit status 2.")
    p.add_argument("--config", required=True, help="configs/FILE.py[:variant]")
    p.add_argument("--workdir", required=True, type=Path,
                   help="checkpoints, metrics.jsonl and tb/ go here: a new or empty directory, or the workdir of "
                        "the run to resume (one run at a time: it is locked while a run uses it)")
    add_trust_flag(p)
    p.set_defaults(func=run_train, accepts_config_overrides=True)

    m = subparsers.add_parser("merge", help="average vt checkpoints at the parameter level",
                              description="Merge model checkpoints (or learner step directories) into one: "
                                          "out = sum_i w_i * params_i, weights normalised to sum to 1.")
    m.add_argument("ckpts", nargs="+", type=Path, help="checkpoint directories (same architecture)")
    m.add_argument("--out", required=True, type=Path, help="output checkpoint directory (must not exist)")
    m.add_argument("--weights", default=None,
                   help="comma-separated non-negative weights, one per checkpoint (default: uniform)")
    add_trust_flag(m)
    m.set_defaults(func=run_merge)


# The learners `vt train` runs, by the config's top-level `learner` field: module and entry function, named
# rather than imported so that vt.train does not depend on vt.rl (which builds on vt.train).
LEARNERS = {"sft": ("vt.train.sft", "SftConfig", "train"), "rl": ("vt.rl.learner", "RLConfig", "train_rl")}


def run_train(args: argparse.Namespace) -> int:
    import importlib
    import logging

    from vt.config import load_config, to_dataclass

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("vt").setLevel(logging.INFO)
    from vt.checkpoint.manager import check_workdir

    check_output_path(args.workdir, "--workdir", directory=True)
    check_workdir(args.workdir)
    raw = load_config(args.config, args.config_overrides)
    learner = raw.get("learner")
    if learner not in LEARNERS:
        raise VtError(f"{args.config}: top-level field `learner` is {learner!r}; expected one of "
                      f"{', '.join(map(repr, LEARNERS))} (which learner reads the config)")
    module_name, config_name, entry_name = LEARNERS[learner]
    module = importlib.import_module(module_name)
    result = getattr(module, entry_name)(to_dataclass(getattr(module, config_name), raw), args.workdir)
    m = result.last_metrics
    tail = f", loss {m['loss']:.4f}" if "loss" in m else ""
    for key in ("eval_loss", "eval_accuracy"):
        if key in m:
            tail += f", {key} {m[key]:.4f}"
    print(f"{result.status} at step {result.step}{tail}; checkpoints in {args.workdir / 'checkpoints'}")
    return EXIT_PREEMPTED if result.status == "preempted" else 0


def run_merge(args: argparse.Namespace) -> int:
    from vt.train.merge import merge_checkpoints

    weights = None
    if args.weights is not None:
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            raise VtError(f"--weights {args.weights!r}: expected comma-separated numbers") from None
    check_output_path(args.out, "--out", directory=True)
    used = merge_checkpoints(args.ckpts, args.out, weights)
    print(f"wrote {args.out} = " + " + ".join(f"{w:.4g} * {c}" for c, w in zip(args.ckpts, used)))
    return 0
