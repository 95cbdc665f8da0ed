"""`vt data filter|dedup|decontam|expand|judge|distill|stratify`: data construction around the stages.

Every subcommand reads JSONL or parquet and writes JSONL or parquet (by the output's extension), resumes
when re-run with the same output (``<out>.journal``), shows a progress bar, writes what it removed and
why to ``<out>.rejected.jsonl`` and the per-reason counts to ``<out>.report.json``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vt import VtError
from vt.datagen.teacher import DISTILL_DOMAINS
from vt.rewards.registry import WORKERS, RewardsConfig, make_reward, with_options
from vt.validation import (FieldError, check_output_path, fraction, integer, non_negative_float, non_negative_int,
                           number, positive_int, refuse_same_file)


def _io(p, out_help="output .jsonl or .parquet (re-run to resume)"):
    p.add_argument("input", help="input .jsonl or .parquet")
    p.add_argument("output", help=out_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _teacher_args(p, what="teacher"):
    p.add_argument(f"--{what}", required=True, help="ckpt:DIR (vt sampler; needs --tokenizer) or "
                                                    "openai:URL|MODEL[|API_KEY_ENV]")
    p.add_argument("--tokenizer", default="", help="HF tokenizer directory for a ckpt: teacher")
    p.add_argument("--temperature", type=non_negative_float, default=1.0)
    p.add_argument("--top-p", type=number(gt=0, le=1), default=0.95)
    p.add_argument("--max-new-tokens", type=positive_int, default=16384)
    p.add_argument("--batch-rows", type=positive_int, default=16, help="input rows per teacher call")
    p.add_argument("--seed", type=non_negative_int, default=0)


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="data construction: filter, dedup, decontam, expand, judge, "
                                              "distill, stratify")
    sub = data.add_subparsers(dest="data_command", required=True)

    p = sub.add_parser("filter", help="n-gram quality filters (repetition, templated degeneration, length)")
    _io(p)
    p.add_argument("--repetition-n", type=positive_int, default=10)
    p.add_argument("--max-repetition", type=fraction, default=0.5, help="reject above this repetition score")
    p.add_argument("--template-n", type=positive_int, default=6)
    p.add_argument("--max-template", type=fraction, default=0.7, help="reject above this digit-blind score")
    p.add_argument("--min-chars", type=non_negative_int, default=1)
    p.add_argument("--max-chars", type=non_negative_int, default=0, help="0 = no limit")
    p.add_argument("--require-response", action="store_true", help="reject rows without an assistant turn")
    p.set_defaults(func=run_filter)

    p = sub.add_parser("dedup", help="exact and near-duplicate removal (MinHash LSH)")
    _io(p)
    p.add_argument("--key", choices=("prompt", "response", "all"), default="all")
    p.add_argument("--near-threshold", type=fraction, default=0.8, help="Jaccard threshold; 0 = exact only")
    p.add_argument("--num-perm", type=positive_int, default=128)
    p.add_argument("--shingle", type=positive_int, default=5, help="words per shingle")
    p.set_defaults(func=run_dedup)

    p = sub.add_parser("decontam", help="drop rows sharing a word n-gram with evaluation sets")
    _io(p)
    p.add_argument("--eval", action="append", required=True, help="evaluation set (.jsonl/.parquet); repeatable")
    p.add_argument("-n", "--ngram", type=positive_int, default=13)
    p.add_argument("--min-short-words", type=non_negative_int, default=6, help="shorter eval texts match whole")
    p.add_argument("--part", choices=("prompt", "response", "all"), default="all")
    p.set_defaults(func=run_decontam)

    p = sub.add_parser("expand", help="teacher rewrites of seed queries (concept, skeleton, constraints, "
                                      "objective), optionally judged")
    _io(p)
    _teacher_args(p)
    p.add_argument("--strategies", default="concept,skeleton,constraints,objective")
    p.add_argument("--judge", default="", help="query-quality judge (same forms as --teacher); '' = none")
    p.set_defaults(func=run_expand)

    p = sub.add_parser("judge", help="LLM query-quality filter")
    _io(p)
    _teacher_args(p, "judge")
    p.set_defaults(func=run_judge)

    p = sub.add_parser("distill", help="k teacher traces per query; keep verified ones (reference or vote)")
    _io(p)
    _teacher_args(p)
    p.add_argument("-k", type=positive_int, default=8, help="samples per query")
    p.add_argument("--domain", default="", choices=("", *DISTILL_DOMAINS),
                   help="math, stem, code or instruct ('' = each row's own)")
    p.add_argument("--min-agreement", type=fraction, default=0.5, help="pseudo-label vote share of k")
    p.add_argument("--no-reference", action="store_true", help="ignore references: vote even when present")
    p.add_argument("--workers", type=integer(ge=1, le=WORKERS.le), default=None,
                   help="concurrent verifications per reward domain (rewards.<domain>.workers; default: the domain's)")
    p.set_defaults(func=run_distill)

    p = sub.add_parser("stratify", help="curriculum manifests (stage1/stage2/pass_rates) by difficulty and length")
    p.add_argument("input", help="verified traces (.jsonl/.parquet)")
    p.add_argument("output", help="output directory")
    p.add_argument("--difficulty-edges", default="0.25,0.5,0.75")
    p.add_argument("--length-edges", default="1024,5000,16384")
    p.add_argument("--min-trace-tokens", type=non_negative_int, default=5000)
    p.add_argument("--min-error-rate", type=fraction, default=0.75)
    p.add_argument("--min-rollouts", type=positive_int, default=8)
    p.add_argument("--tokenizer", default="", help="count trace tokens when metadata.trace_length is absent")
    p.set_defaults(func=run_stratify)


def _open(args):
    """The output writer, opened only once the input and output paths are known to be usable (a missing
    input used to leave a fresh empty output and journal behind)."""
    from vt.datagen.stages import open_writer
    _check_input(args.input)
    refuse_same_file(args.input, args.output, "INPUT", "OUTPUT")
    check_output_path(args.output, "OUTPUT")
    return open_writer(args.output)


def _check_input(path: str) -> None:
    if not Path(path).is_file():
        raise VtError(f"{path}: no such input file" + (" (it is a directory)" if Path(path).is_dir() else ""))


def _finish(report: dict) -> int:
    counts = report["counts"]
    kept, total = counts.get("kept", 0), sum(counts.values())
    if total and not kept:  # an empty output is a failure to stop a script on, not a result
        removed = ", ".join(f"{reason} {n}" for reason, n in counts.items())
        raise VtError(f"{report['output']}: every one of the {total} input rows was removed ({removed}); "
                      f"reasons in {report['rejected']}")
    print(f"{report['input']} -> {report['output']}: {kept} of {total} rows kept")
    for reason, n in counts.items():
        if reason != "kept":
            print(f"  {reason}: {n}")
    print(f"removed rows and reasons: {report['rejected']}")
    return 0


def run_filter(args) -> int:
    from vt.datagen.quality import FilterConfig, filter_step
    from vt.datagen.stages import run_stage
    try:
        cfg = FilterConfig(args.repetition_n, args.max_repetition, args.template_n, args.max_template,
                           args.min_chars, args.max_chars, args.require_response)
    except FieldError as e:  # each field is the flag of the same name
        raise VtError(f"--{e.field.replace('_', '-')}: {e.detail}") from None
    return _finish(run_stage(args.input, _open(args), filter_step(cfg), desc="filter",
                             progress=not args.no_progress, report={"config": dataclasses.asdict(cfg)}))


def run_dedup(args) -> int:
    from vt.datagen.quality import DedupConfig, dedup_step
    from vt.datagen.stages import run_stage
    cfg = DedupConfig(args.key, args.near_threshold, args.num_perm, args.shingle)
    w = _open(args)
    return _finish(run_stage(args.input, w, dedup_step(cfg, w.kept_rows), desc="dedup",
                             progress=not args.no_progress, report={"config": dataclasses.asdict(cfg)}))


def run_decontam(args) -> int:
    from vt.datagen.quality import Decontaminator, decontam_step, eval_texts
    from vt.datagen.stages import run_stage
    deco = Decontaminator(eval_texts(args.eval), args.ngram, args.min_short_words)
    return _finish(run_stage(args.input, _open(args), decontam_step(deco, args.part),
                             desc="decontam", progress=not args.no_progress,
                             report={"eval_sets": args.eval, "ngram": args.ngram}))


def _teacher(args, spec):
    from vt.eval.generation import teacher_from_spec
    return teacher_from_spec(spec, tokenizer=args.tokenizer, temperature=args.temperature, top_p=args.top_p,
                             max_new_tokens=args.max_new_tokens, seed=args.seed)


def run_expand(args) -> int:
    from vt.datagen.stages import run_stage
    from vt.datagen.teacher import expand_batch
    judge = _teacher(args, args.judge) if args.judge else None
    step = expand_batch(_teacher(args, args.teacher), [s.strip() for s in args.strategies.split(",") if s.strip()],
                        judge)
    return _finish(run_stage(args.input, _open(args), batch_step=step, batch_size=args.batch_rows,
                             desc="expand", progress=not args.no_progress, report={"teacher": args.teacher}))


def run_judge(args) -> int:
    from vt.datagen.stages import run_stage
    from vt.datagen.teacher import judge_batch
    return _finish(run_stage(args.input, _open(args), batch_step=judge_batch(_teacher(args, args.judge)),
                             batch_size=args.batch_rows, desc="judge", progress=not args.no_progress,
                             report={"judge": args.judge}))


def run_distill(args) -> int:
    from vt.datagen.stages import run_stage
    from vt.datagen.teacher import DistillConfig, distill_batch
    cfg = DistillConfig(args.k, args.domain, args.min_agreement, not args.no_reference)
    options = with_options(RewardsConfig(), workers=args.workers)

    class Rewards(dict):  # a domain's verifier starts when its first row shows up
        def __missing__(self, d):
            self[d] = make_reward(d, options)
            return self[d]

    rewards = Rewards()
    try:
        step = distill_batch(_teacher(args, args.teacher), cfg, rewards)
        return _finish(run_stage(args.input, _open(args), batch_step=step, batch_size=args.batch_rows,
                                 desc="distill", progress=not args.no_progress,
                                 report={"teacher": args.teacher, "k": args.k}))
    finally:
        for r in rewards.values():
            r.close()


def _floats(text: str, name: str, cast=float) -> tuple:
    try:
        return tuple(cast(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise VtError(f"--{name} {text!r}: expected comma-separated numbers") from None


def run_stratify(args) -> int:
    from vt.datagen.stratify import StratifyConfig, run_stratify as run
    _check_input(args.input)
    check_output_path(args.output, "OUTPUT", directory=True)
    cfg = StratifyConfig(_floats(args.difficulty_edges, "difficulty-edges"),
                         _floats(args.length_edges, "length-edges", int), args.min_trace_tokens, args.min_error_rate, args.min_rollouts, args.tokenizer)
    manifest = run(args.input, Path(args.output), cfg)
    print(json.dumps({k: manifest[k] for k in ("stage1", "stage2", "prompts_with_pass_rate")}))
    return 0
