"""`vt sample`: completions for a JSONL file of prompts.

Input, one JSON object per line (blank lines are skipped), exactly one of
    {"prompt_ids": [int, ...]}      token ids, used as they are
    {"prompt": "text"}              encoded with --tokenizer (no special tokens added)
    {"messages": [{"role": ..., "content": ...}, ...]}   the tokenizer's chat template + generation prompt
and optionally "max_new_tokens" (int, overrides the flag for this prompt) and "n" (samples for this prompt).
Output, one line per sample, in input order:
    {"index": i, "sample": j, "prompt_ids": [...], "completion_ids": [...], "logprobs": [...],
     "finish_reason": "stop"|"length", "completion": "..." (only with --tokenizer)}
With --tool NAME (needs --tokenizer): the model may call that tool (Qwen's <tool_call> format; vt.tools) up to
--max-turns times per sample; each line also holds "policy_mask" (1 on the policy's tokens, 0 on the tool
turns') and "tool_calls", and finish_reason may be "max_turns".
All input is checked before the model loads; OUT is written to a temporary file and renamed at the end, so
an error leaves an existing OUT untouched.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from vt import VtError
from vt.checkpoint.seal import add_trust_flag
from vt.io import atomic_write_json, exclusive, write_jsonl
from vt.sampling.config import DECODE_KERNELS
from vt.validation import (check_output_path, non_empty, non_negative_float, non_negative_int, number,
                           parse_json_line, positive_int, refuse_same_file, top_k)

PROMPT_FIELDS = ("prompt_ids", "prompt", "messages")
OPTIONAL_FIELDS = ("max_new_tokens", "n")


def register(subparsers) -> None:
    p = subparsers.add_parser("sample", help="generate completions for a JSONL file of prompts")
    p.add_argument("--ckpt", type=Path, required=True, help="vt checkpoint directory")
    p.add_argument("--prompts", type=Path, required=True, help="input JSONL (prompt_ids, prompt or messages)")
    p.add_argument("--out", type=Path, required=True, help="output JSONL, one line per sample")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="HF tokenizer directory or SentencePiece .model (needed for prompt/messages/--stop)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy")
    p.add_argument("--top-p", type=number(gt=0, le=1), default=1.0)
    p.add_argument("--top-k", type=top_k, default=-1, help="-1 = off")
    p.add_argument("--n", type=positive_int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=64, help="decode slots (concurrent samples)")
    p.add_argument("--stop", action="append", default=[], type=non_empty, metavar="STR",
                   help="stop string (repeatable; not empty)")
    p.add_argument("--page-size", type=positive_int, default=16, help="tokens per KV cache page")
    p.add_argument("--kv-pages", type=non_negative_int, default=0,
                   help="KV pool size in pages (0: half the free device memory, at most what every slot needs)")
    p.add_argument("--decode-attention", choices=DECODE_KERNELS, default="auto",
                   help="decode kernel: auto (Pallas on TPU, XLA elsewhere), xla, or pallas (also JAX's Pallas "
                        "kernel on NVIDIA GPUs)")
    p.add_argument("--tool", action="append", default=[], type=non_empty, metavar="NAME", dest="tools",
                   help="a tool the model may call (repeatable; vt.tools.registry, e.g. python); needs --tokenizer")
    p.add_argument("--max-turns", type=positive_int, default=4, help="tool calls per sample at most")
    p.add_argument("--max-tool-output-tokens", type=positive_int, default=256,
                   help="a tool's output past this many tokens is cut, with a note")
    p.add_argument("--tool-timeout", type=number(gt=0), default=5.0, help="seconds one tool call may run")
    p.add_argument("--stats-json", type=Path, default=None, metavar="FILE",
                   help="write the run's statistics (decode steps, tokens, prefill tokens, pages, preemptions, "
                        "seconds split prefill/decode/host) to FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_trust_flag(p)
    p.set_defaults(func=run)


def read_requests(path: Path, tokenizer, vocab_size: int, max_context: int) -> tuple[list, list[int]]:
    """Parse and check every line; VtError names the line at fault. Returns the requests and their line numbers."""
    from vt.sampling.config import Request
    from vt.sampling.engine import check_prompt
    if not path.is_file():
        raise VtError(f"{path}: no such prompts file")
    requests, lines = [], []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            rec = parse_json_line(line, where)
            if not isinstance(rec, dict):
                raise VtError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            unknown = sorted(set(rec) - set(PROMPT_FIELDS) - set(OPTIONAL_FIELDS))
            if unknown:
                raise VtError(f"{where}: unknown field(s) {unknown}; expected one of {list(PROMPT_FIELDS)} "
                              f"and optionally {list(OPTIONAL_FIELDS)}")
            given = [k for k in PROMPT_FIELDS if k in rec]
            if len(given) != 1:
                raise VtError(f"{where}: expected exactly one of {list(PROMPT_FIELDS)}, got {given or 'none'}")
            field = given[0]
            value = rec[field]
            if field == "prompt_ids":
                ids = value
                if not isinstance(ids, list):
                    raise VtError(f"{where}: field 'prompt_ids' must be a list of integers")
            else:
                if tokenizer is None:
                    raise VtError(f"{where}: field '{field}' needs --tokenizer")
                if field == "prompt":
                    if not isinstance(value, str):
                        raise VtError(f"{where}: field 'prompt' must be a string")
                    ids = tokenizer.encode(value)
                else:
                    if not isinstance(value, list) or not value:
                        raise VtError(f"{where}: field 'messages' must be a non-empty list of messages")
                    try:
                        ids = tokenizer.encode_chat(value, add_generation_prompt=True)
                    except VtError as e:
                        raise VtError(f"{where}: field 'messages': {e}") from None
            ids = check_prompt(ids, vocab_size, max_context, f"{where}: field '{field}'").tolist()
            extra = {}
            for k in OPTIONAL_FIELDS:
                if k in rec:
                    v = rec[k]
                    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                        raise VtError(f"{where}: field '{k}' must be a positive integer, got {v!r}")
                    extra[k] = v
            requests.append(Request(prompt_ids=ids, **extra))
            lines.append(lineno)
    if not requests:
        raise VtError(f"{path}: no prompts")
    return requests, lines


def _check_memory(args, cfg, model_cfg, requests, lines, context: int) -> None:
    """The engine's up-front memory check, before the model loads, naming flags and input lines."""
    import numpy as np

    from vt.sampling.page_table import check_memory, device_memory_bytes, free_device_bytes, host_memory_bytes
    reqs = [(np.asarray(r.prompt_ids), min(r.max_new_tokens or cfg.max_new_tokens, context - len(r.prompt_ids)),
             r.n or cfg.n) for r in requests]

    def name(i: int) -> str:
        where = f"{args.prompts} line {lines[i]}"
        if requests[i].n is None and requests[i].max_new_tokens is None:
            return f"--n {cfg.n} and --max-new-tokens {cfg.max_new_tokens} ({where})"
        return where

    check_memory(model_cfg, cfg, reqs, context, device_bytes=device_memory_bytes(), host_bytes=host_memory_bytes(),
                 free_bytes=free_device_bytes(), batch_name="--batch-size", request_name=name)


def run(args: argparse.Namespace) -> int:
    from vt.checkpoint.params import load_model, load_model_config
    from vt.sampling.config import SamplerConfig, ToolsConfig
    from vt.sampling.engine import Engine
    from vt.tools import python as _builtin  # noqa: F401  (registers the built-in tools)
    from vt.tools.registry import TOOLS

    tools = None
    if args.tools:
        unknown = [t for t in args.tools if t not in TOOLS]
        if unknown:
            raise VtError(f"--tool {unknown[0]}: no such tool (the tools: {', '.join(sorted(TOOLS))})")
        tools = ToolsConfig(tools=tuple(dict.fromkeys(args.tools)), max_turns=args.max_turns,
                            max_tool_output_tokens=args.max_tool_output_tokens, timeout_s=args.tool_timeout)
    cfg = SamplerConfig(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=args.top_p, top_k=args.top_k, n=args.n, seed=args.seed, stop_strings=tuple(args.stop),
                        page_size=args.page_size, kv_pages=args.kv_pages, decode_attention=args.decode_attention,
                        tools=tools)
    refuse_same_file(args.prompts, args.out, "--prompts", "--out")
    check_output_path(args.out, "--out")
    tokenizer = None
    if args.tokenizer is not None:
        from vt.data.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(args.tokenizer)
    if cfg.stop_strings and tokenizer is None:
        raise VtError("--stop needs --tokenizer")
    if tools is not None and tokenizer is None:
        raise VtError("--tool needs --tokenizer")
    model_cfg = load_model_config(args.ckpt)
    context = model_cfg.max_position_embeddings
    requests, lines = read_requests(args.prompts, tokenizer, model_cfg.vocab_size, context)
    out_dir = args.out.absolute().parent
    if not out_dir.is_dir():
        raise VtError(f"{args.out}: directory {out_dir} does not exist")
    if args.stats_json is not None:
        check_output_path(args.stats_json, "--stats-json")
    # Locked until OUT is written: a second `vt sample` to the same OUT is refused at once, where it would
    # compute for nothing and then replace this one's output; before the memory check, which starts JAX's
    # backend (device memory the first one may be using).
    with exclusive(args.out, "--out", inside=False):
        _check_memory(args, cfg, model_cfg, requests, lines, context)
        engine = Engine(load_model(args.ckpt), cfg, tokenizer=tokenizer)
        total = sum(r.n or cfg.n for r in requests)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm
            bar = tqdm(total=total, unit="sample", file=sys.stderr, desc="vt sample")
        try:
            results = engine.generate(requests, progress=bar.update if bar else None)
        finally:
            engine.close()
            if bar is not None:
                bar.close()

        def rows():
            for i, (req, samples) in enumerate(zip(requests, results)):
                for j, s in enumerate(samples):
                    rec = {"index": i, "sample": j, "prompt_ids": list(req.prompt_ids),
                           "completion_ids": s.completion_ids, "logprobs": s.logprobs, "finish_reason": s.finish_reason}
                    if tokenizer is not None:
                        rec["completion"] = s.text
                    if tools is not None:
                        mask = s.policy_mask if s.policy_mask is not None else [True] * len(s.completion_ids)
                        rec["policy_mask"], rec["tool_calls"] = [int(m) for m in mask], s.tool_calls
                    yield rec

        write_jsonl(args.out, rows())
        st = engine.last_stats
        if args.stats_json is not None:
            atomic_write_json(args.stats_json, dataclasses.asdict(st), indent=1)
        print(f"wrote {total} samples to {args.out}: {st.tokens} tokens in {st.seconds:.1f}s "
              f"({st.tokens / max(st.seconds, 1e-9):.1f} tokens/s, {st.decode_steps} decode steps)", file=sys.stderr)
    return 0
