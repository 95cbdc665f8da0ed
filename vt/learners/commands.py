"""`vt train`: the learner a config names (vt.learners.registry), run or resumed in a work directory."""
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


def run_train(args: argparse.Namespace) -> int:
    import logging

    from vt.config import load_config, to_dataclass
    from vt.learners.registry import LEARNERS

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
    config_class, entry = LEARNERS[learner]
    result = entry(to_dataclass(config_class, raw), args.workdir)
    m = result.last_metrics
    tail = f", loss {m['loss']:.4f}" if "loss" in m else ""
    for key in ("eval_loss", "eval_accuracy"):
        if key in m:
            tail += f", {key} {m[key]:.4f}"
    print(f"{result.status} at step {result.step}{tail}; checkpoints in {args.workdir / 'checkpoints'}")
    return EXIT_PREEMPTED if result.status == "preempted" else 0
