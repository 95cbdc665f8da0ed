"""`vt reward`: score a JSONL file of completions with one domain's verifiable reward.

    vt reward --domain math --input rollouts.jsonl --out scored.jsonl --workers 4

Each input line is an object with ``completion`` plus the domain's reference (``ground_truth`` for math
and stem; for code ``tests``, or a HumanEval / MBPP / LiveCodeBench / verl code record as it comes; for
instruct ``constraints``, or IFEval's ``instruction_id_list`` + ``kwargs``; ``prompt`` + ``rubric`` for
rubric). Each
output line is the same object plus ``score`` (null for a verifier error) and ``details`` (with
``failure``). The whole input is validated before anything runs; the output appears atomically (a
temporary file renamed at the end), so a bad input never truncates an existing output.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
from pathlib import Path

from vt import VtError
from vt.io import write_jsonl
from vt.rewards.registry import DOMAINS, SECONDS, WORKERS, RewardsConfig, make_reward, takes
from vt.validation import check_output_path, integer, number, parse_json_line, positive_int, refuse_same_file

_RECORD_PREFIX = re.compile(r"^record \d+: ")  # the CLI names file:line instead


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reward",
        help=f"score completions in a JSONL file ({', '.join(DOMAINS)})",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--domain", required=True, choices=DOMAINS)
    p.add_argument("--input", required=True, type=Path, help="JSONL: one {'completion': ..., <reference>} per line")
    p.add_argument("--out", required=True, type=Path, help="JSONL output: each record plus score and details")
    # Each flag sets the option of its name in the domain's options (vt.rewards.registry; --timeout the one its
    # ``timeout`` names); a flag the domain does not take is refused.
    p.add_argument("--workers", type=integer(ge=1, le=WORKERS.le), default=None,
                   help=f"concurrent verifications (processes, sandboxes, judge requests), 1 to {WORKERS.le}")
    p.add_argument("--timeout", type=number(gt=0, le=SECONDS.le), default=None,
                   help=f"seconds (at most {SECONDS.le}): math and stem per-item deadline, code per-test limit, "
                        "rubric per-request timeout")
    p.add_argument("--batch-size", type=positive_int, default=256, help="records scored per batch")
    p.add_argument("--allow-unsandboxed", action="store_true", default=None,
                   help="code: run untrusted programs WITHOUT isolation if bubblewrap is unavailable")
    p.add_argument("--mode", choices=("strict", "loose"), default=None, help="instruct: IFEval scoring mode")
    p.add_argument("--judge-url", help="rubric: OpenAI-compatible API base, e.g. http://localhost:8000/v1")
    p.add_argument("--judge-model", help="rubric: judge model name")
    p.add_argument("--judge-api-key-env", help="rubric: name of the environment variable holding the API key")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


OPTION_FLAGS = ("workers", "timeout", "allow_unsandboxed", "mode", "judge_url", "judge_model", "judge_api_key_env")


def build_reward(args: argparse.Namespace):
    domain, options = args.domain, getattr(RewardsConfig(), args.domain)
    flags = {name: getattr(args, name) for name in OPTION_FLAGS if getattr(args, name) is not None}
    given = {}
    for flag, value in flags.items():
        name = options.timeout if flag == "timeout" else flag
        if name is None or not takes(domain, name):
            raise VtError(f"--{flag.replace('_', '-')}: --domain {domain} takes no such option")
        given[name] = value
    if domain == "rubric" and not (args.judge_url and args.judge_model):
        raise VtError("--domain rubric needs --judge-url and --judge-model")
    try:
        return make_reward(domain, dataclasses.replace(RewardsConfig(), **{domain: dataclasses.replace(options, **given)}))
    except (ValueError, RuntimeError) as e:  # SandboxUnavailable, a missing API key variable
        raise VtError(str(e)) from e


def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) for every non-blank line; VtError names the first bad line."""
    if not path.is_file():
        raise VtError(f"{path}: no such file")
    out = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = parse_json_line(line, f"{path}:{lineno}")
            if not isinstance(rec, dict):
                raise VtError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            if not isinstance(rec.get("completion"), str):
                raise VtError(f"{path}:{lineno}: field 'completion' missing or not a string")
            out.append((lineno, rec))
    if not out:
        raise VtError(f"{path}: no records")
    return out


def run(args: argparse.Namespace) -> int:
    from vt.rewards.base import RewardSpecError

    refuse_same_file(args.input, args.out, "--input", "--out")
    check_output_path(args.out, "--out")
    records = read_records(args.input)
    if not args.out.parent.is_dir():
        raise VtError(f"{args.out}: directory {args.out.parent} does not exist")
    with build_reward(args) as reward:
        references = []
        for lineno, rec in records:
            try:
                references.append(reward.reference(rec, lineno))
            except RewardSpecError as e:
                raise VtError(f"{args.input}:{lineno}: {_RECORD_PREFIX.sub('', str(e))}") from None
        counts, score_sum = _write_scored(args, reward, records, references)
    valid = len(records) - counts.get("verifier_error", 0)
    summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    print(
        f"vt reward: {len(records)} records -> {args.out} (mean score {score_sum / max(valid, 1):.4f} over "
        f"{valid} verified; {summary})",
        file=sys.stderr,
    )
    return 0


def _write_scored(args, reward, records, references) -> tuple[collections.Counter, float]:
    """Score in batches into --out, which is replaced only when every record is scored (vt.io.write_jsonl)."""
    counts: collections.Counter = collections.Counter()
    score_sum = 0.0

    def scored_rows():
        nonlocal score_sum
        for start in range(0, len(records), args.batch_size):
            chunk = records[start : start + args.batch_size]
            refs = references[start : start + args.batch_size]
            results = reward.score_batch(refs, [rec["completion"] for _, rec in chunk])
            for (_, rec), res in zip(chunk, results):
                counts[res.failure or "ok"] += 1
                score_sum += res.score or 0.0  # verifier errors (None) are excluded via `valid`
                yield {**rec, **res.to_json()}
            bar.update(len(chunk))

    if args.no_progress:  # tqdm's import (importlib.metadata's with it) is start-up time: paid only for a bar
        bar = _NoBar()
    else:
        from tqdm import tqdm

        bar = tqdm(total=len(records), unit="record", file=sys.stderr, desc="vt reward")
    try:
        write_jsonl(args.out, scored_rows())
    finally:
        bar.close()
    return counts, score_sum


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
