"""`vt tokenizer build-qwen2.5 [OUT_DIR]`: Qwen2.5's real tokenizer from the dashscope wheel's BPE ranks."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    tok = subparsers.add_parser("tokenizer", help="tokenizers: build Qwen2.5's from public BPE ranks")
    sub = tok.add_subparsers(dest="tokenizer_command", required=True)
    p = sub.add_parser("build-qwen2.5", help="build the Qwen2.5 HF tokenizer directory (cached)")
    p.add_argument("out_dir", nargs="?", type=Path, default=None,
                   help="output directory (default: the cache, $VT_CACHE_DIR or $XDG_CACHE_HOME/vt or ~/.cache/vt)")
    p.add_argument("--wheel", type=Path, default=None, help="dashscope-2.0.2 wheel (default: the cached one)")
    p.add_argument("--download", action="store_true",
                   help="fetch the wheel with this Python's pip when it is not cached")
    p.add_argument("--force", action="store_true", help="rebuild even when OUT_DIR already holds this build")
    p.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    from vt.data import qwen_tokenizer as q

    out = args.out_dir if args.out_dir is not None else q.default_tokenizer_dir()
    if q.is_built(out) and not args.force:
        print(f"{out}: Qwen2.5 tokenizer already built", file=sys.stderr)
        return 0
    wheel = args.wheel
    if wheel is None and args.download:
        wheel = q.download_wheel()
    path = q.build_qwen25_tokenizer(out, wheel, force=args.force)
    print(f"wrote the Qwen2.5 tokenizer to {path}", file=sys.stderr)
    return 0
