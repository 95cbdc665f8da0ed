"""`vt tokenizer build-qwen2.5 | build-qwen3 [OUT_DIR]`: Qwen2.5's / Qwen3's real tokenizer from the dashscope wheel's
BPE ranks."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    tok = subparsers.add_parser("tokenizer", help="tokenizers: build Qwen2.5's or Qwen3's from public BPE ranks")
    sub = tok.add_subparsers(dest="tokenizer_command", required=True)
    for family, name in (("qwen2.5", "Qwen2.5"), ("qwen3", "Qwen3")):
        _build_parser(sub.add_parser(f"build-{family}", help=f"build the {name} HF tokenizer directory (cached)"),
                      family)


def _build_parser(p, family: str) -> None:
    p.add_argument("out_dir", nargs="?", type=Path, default=None,
                   help="output directory (default: the cache, $VT_CACHE_DIR or $XDG_CACHE_HOME/vt or ~/.cache/vt)")
    p.add_argument("--wheel", type=Path, default=None, help="dashscope-2.0.2 wheel (default: the cached one)")
    p.add_argument("--download", action="store_true",
                   help="fetch the wheel with this Python's pip when it is not cached")
    p.add_argument("--force", action="store_true", help="rebuild even when OUT_DIR already holds this build")
    p.set_defaults(func=run_build, family=family)


def run_build(args: argparse.Namespace) -> int:
    from vt.data import qwen_tokenizer as q

    out = args.out_dir if args.out_dir is not None else q.default_tokenizer_dir(args.family)
    if q.is_built(out, args.family) and not args.force:
        print(f"{out}: {args.family} tokenizer already built", file=sys.stderr)
        return 0
    wheel = args.wheel
    if wheel is None and args.download:
        wheel = q.download_wheel()
    path = q.build_qwen_tokenizer(out, wheel, force=args.force, family=args.family)
    print(f"wrote the {args.family} tokenizer to {path}", file=sys.stderr)
    return 0
