"""`vt profile`: pass rates of a checkpoint on a prompt set (RL prompt filtering, SFT stage-2 selection)."""
from __future__ import annotations

import argparse
from pathlib import Path

from vt.checkpoint.seal import add_trust_flag
from vt.rewards.registry import DOMAINS
from vt.validation import check_output_path, non_negative_float, non_negative_int, number, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="sample k responses per prompt, verify, write pass rates (JSONL)",
                              description="One line per prompt id: {id, pass_rate, n, verifier_errors}. "
                                          "Appends and skips ids already in --out, so a killed run resumes.")
    p.add_argument("--ckpt", required=True, type=Path, help="vt checkpoint to profile")
    p.add_argument("--tokenizer", required=True, type=Path, help="tokenizer directory or SentencePiece model")
    p.add_argument("--data", required=True, help="prompt records: verl parquet, JSONL, ... (vt.data.open_source)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--k", type=positive_int, default=8, help="samples per prompt (RECIPE: 8)")
    p.add_argument("--domain", default="", choices=("", *DOMAINS),
                   help="reward domain for every record (default: each record's own)")
    p.add_argument("--temperature", type=non_negative_float, default=1.0)
    p.add_argument("--top-p", type=number(gt=0, le=1), default=1.0)
    p.add_argument("--max-new-tokens", type=positive_int, default=4096)
    p.add_argument("--batch-size", type=positive_int, default=64, help="decode slots")
    p.add_argument("--seed", type=non_negative_int, default=0)
    add_trust_flag(p)
    p.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    from vt.rl.profile import profile
    from vt.sampling.config import SamplerConfig
    check_output_path(args.out, "--out")
    sampler = SamplerConfig(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    added = profile(args.ckpt, args.tokenizer, args.data, args.out, sampler, k=args.k, domain=args.domain)
    print(f"profiled {added} prompts -> {args.out}")
    return 0
