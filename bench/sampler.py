"""Rollout tokens/s: vt's engine vs transformers `generate` vs the Tunix sampler, same weights, same workload.

    .venv/bin/python bench/sampler.py [--prompts 64] [--n 4] [--batch-size 64] [--short 32] [--long 256]
                                      [--long-every 8] [--size tiny|small] [--arch qwen2|qwen3] [--skip-tunix]
                                      [--skip-hf]
    .venv/bin/python bench/sampler.py --setup-tunix     # once: a separate venv with google-tunix (see below)
    .venv/bin/python bench/sampler.py --roofline [--roofline-dtype bfloat16] [--json FILE]
    .venv/bin/python bench/sampler.py --tools [--tool-batch 16] [--tool-n 16] [--skip-hf --skip-tunix] [--json FILE]

`--tools` adds a row: tool-call latency hidden behind decoding. A tiny model trained briefly (200 steps) to call a
tool twice per sample (bench/tool_policy.py, tool `bench_calc`: the product its code prints) samples the same
workload (its 4 prompts x `--tool-n` samples at temperature 1, `--tool-batch` slots) twice: with the tool answering
at once and with it sleeping 0.2 s per call. Policy tokens/s of each (runs alternated, A B A B ..., after a warm-up of
each; best of 3 each), and slow / instant; JSON {"tools": {"instant_tok_s", "slow_tok_s", "ratio", ...}}.

`--long N` makes the workload a long tail (every `--long-every`-th prompt wants N new tokens). `--roofline`
measures, instead of tokens/s, the bytes XLA's cost analysis says one compiled decode step of qwen2.5-coder-3b
accesses (abstract shapes, nothing allocated; batch 256, every slot at context 2048, pages of 16) against the
ideal: the weights plus the live KV read once. The cost analysis counts a loop body once, so the measured step
is the engine's own `vt.sampling.steps.decode_step` over the cache's cost-analysis form
(`cost_analysis_cache()` below: page blocks and layers unrolled, per-slot writes). `--json FILE` writes the numbers:
{"roofline": {"bytes_accessed", "ideal_bytes", "ratio", ...}} or {"throughput": {...}}.

Workload (RL-shaped): `--prompts` random prompts of 16..64 tokens, `--n` samples each at temperature 1.0 (no
top-k/top-p), target lengths skewed: every `--long-every`-th prompt wants `--long` new tokens, the rest
`--short`. Lengths are forced with max_new_tokens (random weights never stop by themselves). vt gets the
per-prompt lengths and keeps `--batch-size` slots busy (slot refill). transformers and Tunix have no per-row
length or refill: they run the same samples in batches of `--batch-size`, each batch to its longest target,
which is how an RL loop uses them. tokens/s counts the tokens the workload asked for (the same number for
all three); each framework gets a warm-up run first (compilation excluded). Absolute numbers on a shared CPU
box mean little; the printed ratios are the result.

Tunix runs in its own virtualenv, because google-tunix pins its own dependency set: `--setup-tunix` creates
it at $VT_TUNIX_VENV (default ~/.cache/vt/venv-tunix) with google-tunix==0.1.7 and the jax/flax versions vt
pins, and this script re-runs itself there with `--worker tunix`. Tunix's Qwen2 loads the same HF
safetensors through tunix.models.qwen2.params.create_model_from_safe_tensors.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TUNIX_VENV = Path(os.environ.get("VT_TUNIX_VENV", Path.home() / ".cache" / "vt" / "venv-tunix"))
TUNIX_PINS = ["google-tunix==0.1.7", "jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8"]

SIZES = {  # HF Qwen2Config fields
    "tiny": dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=2),
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2),
}


def workload(args):
    """[(prompt_ids, target_len)] per prompt; each prompt is sampled args.n times."""
    import numpy as np
    rng = np.random.RandomState(0)
    vocab = SIZES[args.size]["vocab_size"]
    return [(rng.randint(0, vocab - 1, rng.randint(16, 65)).tolist(),
             args.long if i % args.long_every == args.long_every - 1 else args.short) for i in range(args.prompts)]


def fixed_batches(work, n, batch):
    """The samples in request order, cut into batches: [(prompts, max target in batch)]."""
    rows = [(p, m) for p, m in work for _ in range(n)]
    chunks = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    return [([p for p, _ in c], max(m for _, m in c)) for c in chunks]


def make_weights(args, out: Path) -> None:
    """Random weights of the workload's model: Qwen2, or with --arch qwen3 the Qwen3 row (q/k norms, no q/k/v bias,
    head_dim stated and 1.5x hidden / heads)."""
    import torch
    import transformers
    torch.manual_seed(0)
    family, shape = "Qwen2", dict(SIZES[args.size])
    if args.arch == "qwen3":
        family, shape["head_dim"] = "Qwen3", 3 * shape["hidden_size"] // shape["num_attention_heads"] // 2
    cfg = getattr(transformers, f"{family}Config")(**shape, max_position_embeddings=max(1024, 2 * (args.long + 64)), rope_theta=10000.0,
                      rms_norm_eps=1e-6,
                      tie_word_embeddings=True)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.5)
    model.save_pretrained(out)


def run_vt(args, hf_dir: Path, work) -> dict:
    from vt.checkpoint.params import model_from_hf
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    engine = Engine(model_from_hf(hf_dir), SamplerConfig(batch_size=args.batch_size, temperature=1.0,
                                                         stop_token_ids=(), n=args.n))
    requests = [Request(p, max_new_tokens=m) for p, m in work]
    engine.generate(requests, seed=1)  # compile
    compiles = engine.compile_count
    t0 = time.perf_counter()
    out = engine.generate(requests, seed=2)
    dt = time.perf_counter() - t0
    assert engine.compile_count == compiles, "timed run recompiled"
    tokens = sum(len(s.completion_ids) for samples in out for s in samples)
    st = engine.last_stats
    return dict(seconds=dt, tokens=tokens, steps=st.decode_steps, compiles=compiles, pool_pages=st.pool_pages,
                peak_pages=st.peak_pages, peak_pages_needed=st.peak_pages_needed, page_bytes=st.page_bytes,
                preemptions=st.preemptions, prefill_seconds=st.prefill_seconds, decode_seconds=st.decode_seconds,
                host_seconds=st.host_seconds)


TOOL_DELAY_S = {"bench_calc": 0.0}  # what the `bench_calc` tool sleeps per call


def run_tools(args) -> dict:
    import re

    import numpy as np
    from tool_policy import tool_policy

    from vt.data.tokenizer import build_tiny_tokenizer
    from vt.sampling.config import Request, SamplerConfig, ToolsConfig
    from vt.sampling.engine import Engine
    from vt.tools.registry import tool

    @tool("bench_calc")
    def bench_calc(arguments, cfg):  # the product `print(a*b)` prints, computed without running the code
        time.sleep(TOOL_DELAY_S["bench_calc"])
        m = re.fullmatch(r"print\((\d+)\*(\d+)\)", str(arguments.get("code", "")))
        return str(int(m[1]) * int(m[2])) if m else "Error: bench_calc reads print(a*b)"

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tiny_tokenizer(Path(tmp) / "tok")
    t = time.perf_counter()
    model, prompts, _ = tool_policy(tok, n_traces=4, calls=2, tool="bench_calc")
    train_s = time.perf_counter() - t
    engine = Engine(model, SamplerConfig(batch_size=args.tool_batch, max_new_tokens=320, temperature=1.0,
                                         n=args.tool_n, tools=ToolsConfig(tools=("bench_calc",), workers=32)),
                    tokenizer=tok)
    requests = [Request(p) for p in prompts]

    def once(delay):
        TOOL_DELAY_S["bench_calc"] = delay
        compiles = engine.compile_count
        out = engine.generate(requests, seed=3)
        st = engine.last_stats
        policy = sum(int(np.sum(s.policy_mask)) if s.policy_mask is not None else len(s.completion_ids)
                     for g in out for s in g)
        # compiles: resume prefills of a shape no earlier run had (how many samples came back at once, how long
        # their tool turns were) compile inside the timed run; load_1min: the box's load when the run ended
        return dict(seconds=st.seconds, policy_tokens=policy, tool_calls=st.tool_calls,
                    tool_wait_seconds=st.tool_wait_seconds, tok_s=policy / st.seconds,
                    compiles=engine.compile_count - compiles, load_1min=os.getloadavg()[0])

    once(0.0), once(0.2)  # compile: each run's resume prefills may take shapes of their own
    compiles = engine.compile_count
    runs = {"instant": [], "slow": []}
    for _ in range(3):
        runs["instant"].append(once(0.0))
        runs["slow"].append(once(0.2))
    best = {k: max(r["tok_s"] for r in v) for k, v in runs.items()}
    return dict(instant_tok_s=best["instant"], slow_tok_s=best["slow"], ratio=best["slow"] / best["instant"],
                runs=runs, train_seconds=train_s, compiles_after_warmup=engine.compile_count - compiles,
                batch=args.tool_batch, samples=len(requests) * args.tool_n)


def cost_analysis_cache():
    """The paged KV cache in a form whose every byte XLA's cost analysis counts, for the same decode step
    (`--roofline`; tests/sampling/test_pages.py checks it computes what vt.model.kv_pages.PagedKVCache does).
    The analysis counts a loop body once, so the layers are unrolled and attention reads exactly every page
    block, unrolled; and it counts a scatter as reading and writing its whole operand (the pool) although it
    updates in place, so each slot's token is written by its own dynamic-update-slice (a loop whose body,
    counted once, leaves out B - 1 tokens: a negligible fraction of a step). Single-token steps only. A factory,
    so that importing this script imports no JAX."""
    import dataclasses
    from typing import ClassVar

    import jax
    import jax.numpy as jnp

    from vt.model import online_softmax
    from vt.model.kv_pages import PagedKVCache, page_blocks

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class CostAnalysisKVCache(PagedKVCache):
        scan_unroll: ClassVar[bool] = True

        def write(self, layer, k_BTKH, v_BTKH, positions_BT) -> "CostAnalysisKVCache":
            Z = self.page_size
            page_B = jnp.take_along_axis(self.page_table, positions_BT // Z, axis=1)[:, 0]

            def write_slots(pool, new_BTKH):
                new_BKH = new_BTKH[:, 0].astype(pool.dtype)
                one = lambda b, pool: jax.lax.dynamic_update_slice(  # noqa: E731
                    pool, new_BKH[b][None, :, None, None, :], (layer, 0, page_B[b], positions_BT[b, 0] % Z, 0))
                return jax.lax.fori_loop(0, new_BTKH.shape[0], one, pool)
            return dataclasses.replace(self, k=write_slots(self.k, k_BTKH), v=write_slots(self.v, v_BTKH))

        def attend(self, layer, q_BTNH, k_BTKH, v_BTKH, positions_BT, segment_ids_BT, impl: str):
            fold, carry, n_blocks, _ = page_blocks(q_BTNH, self.k, self.v, self.page_table, positions_BT,
                                                   q_BTNH.shape[-1] ** -0.5, layer=layer, slice_layer=True)
            for i in range(n_blocks):
                carry = fold(i, carry)
            return online_softmax.finish(carry, q_BTNH.dtype)
    return CostAnalysisKVCache


def roofline(args) -> dict:
    """Bytes accessed by one compiled decode step (XLA cost analysis) vs the weights plus the live KV."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from vt.model.config import param_count, preset
    from vt.model.qwen2 import abstract_model
    from vt.model.kv_pages import PagedKVCache
    from vt.sampling import steps
    from vt.sampling.rules import SamplingParams
    from vt.sharding import abstract_of
    B, ctx, Z = 256, 2048, 16
    mc = preset("qwen2.5-coder-3b", dtype=args.roofline_dtype, param_dtype=args.roofline_dtype)
    graphdef, state = nnx.split(abstract_model(mc))
    M = ctx // Z
    n_pages = B * M + 1
    cache = abstract_of(cost_analysis_cache().abstract(mc, n_pages, Z, PagedKVCache.table_info(B, M)))
    slots = abstract_of(steps.Slots.abstract(B))

    def step(state, cache, slots):
        return steps.decode_step(nnx.merge(graphdef, state), cache, slots, SamplingParams(1.0), ())

    compiled = jax.jit(step, donate_argnums=(1, 2)).lower(state, cache, slots).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    itemsize = jnp.dtype(mc.dtype).itemsize
    weights = param_count(mc, padded=True) * itemsize
    kv = 2 * mc.num_layers * B * ctx * mc.num_kv_heads * mc.head_dim * itemsize
    accessed = float(cost["bytes accessed"])
    return dict(model="qwen2.5-coder-3b", dtype=args.roofline_dtype, batch=B, context=ctx, page_size=Z,
                bytes_accessed=accessed, weight_bytes=weights, kv_bytes=kv, ideal_bytes=weights + kv,
                ratio=accessed / (weights + kv), backend=jax.default_backend())


def run_hf(args, hf_dir: Path, work) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    batches = fixed_batches(work, args.n, args.batch_size)

    def one(prompts, max_new):
        L = max(map(len, prompts))
        ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])  # left padding, as generate expects
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new, eos_token_id=None, pad_token_id=0)
        return out.shape[1] - L

    one(batches[0][0][:4], 4)  # warm-up
    t0 = time.perf_counter()
    steps = sum(one(p, m) for p, m in batches)
    dt = time.perf_counter() - t0
    return dict(seconds=dt, tokens=sum(m for _, m in work) * args.n, steps=steps)


def run_tunix_worker(args, hf_dir: Path, work) -> dict:
    """Runs inside the Tunix venv."""
    import jax.numpy as jnp
    from tunix.generate import sampler as sampler_lib
    from tunix.models.qwen2 import model as model_lib
    from tunix.models.qwen2 import params as params_lib
    hf = json.loads((hf_dir / "config.json").read_text())
    cfg = model_lib.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
        head_dim=hf["hidden_size"] // hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
        rope_theta=int(hf["rope_theta"] if "rope_theta" in hf else hf["rope_parameters"]["rope_theta"]),
        norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf["tie_word_embeddings"], dtype=jnp.float32,
        param_dtype=jnp.float32)
    model = params_lib.create_model_from_safe_tensors(str(hf_dir), cfg)
    vocab = hf["vocab_size"]

    class IdTokenizer:
        """Prompts travel as space-separated ids. pad = vocab - 1 (never in a prompt); no BOS."""
        def encode(self, text, **_):
            return [int(t) for t in text.split()]

        def decode(self, ids, **_):
            return " ".join(map(str, ids))

        def bos_id(self):
            return None

        def eos_id(self):
            return vocab  # never sampled: samples run to their length, as for the other two

        def pad_id(self):
            return vocab - 1

    prompt_bucket = 64
    max_long = max(m for _, m in work)
    sampler = sampler_lib.Sampler(model, IdTokenizer(), sampler_lib.CacheConfig(
        cache_size=prompt_bucket + max_long, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim))
    batches = fixed_batches(work, args.n, args.batch_size)

    def one(prompts, max_new, seed):
        out = sampler([" ".join(map(str, p)) for p in prompts], max_generation_steps=max_new,
                      max_prompt_length=prompt_bucket, temperature=1.0, top_p=1.0, top_k=None, seed=seed,
                      eos_tokens=[vocab])
        return max(len(t) for t in out.tokens)

    for p, m in {m: (p, m) for p, m in batches}.values():  # warm-up: compile every shape the timed run uses
        one(p, m, 0)
    t0 = time.perf_counter()
    steps = sum(one(p, m, i + 1) for i, (p, m) in enumerate(batches))
    dt = time.perf_counter() - t0
    return dict(seconds=dt, tokens=sum(m for _, m in work) * args.n, steps=steps)


def run_tunix(args, hf_dir: Path) -> dict:
    python = TUNIX_VENV / "bin" / "python"
    if not python.exists():
        return dict(error=f"no Tunix venv at {TUNIX_VENV}; run `bench/sampler.py --setup-tunix` first")
    cmd = [str(python), str(Path(__file__).resolve()), "--worker", "tunix", "--hf-dir", str(hf_dir)] + sys.argv[1:]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if proc.returncode != 0:
        return dict(error="Tunix worker failed: " + proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                    else f"Tunix worker exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def setup_tunix() -> None:
    subprocess.run([sys.executable, "-m", "venv", str(TUNIX_VENV)], check=True)
    subprocess.run([str(TUNIX_VENV / "bin" / "pip"), "install", "-q", *TUNIX_PINS], check=True)
    print(f"Tunix venv ready at {TUNIX_VENV}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--short", type=int, default=32)
    ap.add_argument("--long", type=int, default=256)
    ap.add_argument("--long-every", type=int, default=8)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--arch", choices=["qwen2", "qwen3"], default="qwen2", help="qwen3: the Qwen3 row (no Tunix)")
    ap.add_argument("--skip-tunix", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--setup-tunix", action="store_true")
    ap.add_argument("--roofline", action="store_true", help="decode-step bytes accessed vs weights + live KV")
    ap.add_argument("--roofline-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="weights and KV dtype of the measured step (XLA:CPU upcasts bfloat16 matmuls to float32 "
                         "through extra copies, which a GPU or TPU does not)")
    ap.add_argument("--tools", action="store_true", help="add the tool-latency row (instant vs 0.2 s tool)")
    ap.add_argument("--tool-batch", type=int, default=16)
    ap.add_argument("--tool-n", type=int, default=16, help="samples per prompt of the tool row (4 prompts)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the results as JSON")
    ap.add_argument("--worker", choices=["tunix"], help=argparse.SUPPRESS)
    ap.add_argument("--hf-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setup_tunix:
        return setup_tunix()
    if args.roofline:
        sys.path.insert(0, str(REPO))
        r = roofline(args)
        print(f"decode step of {r['model']} ({r['dtype']}, batch {r['batch']}, context {r['context']}, pages of "
              f"{r['page_size']}, {r['backend']}): {r['bytes_accessed'] / 1e9:.2f} GB accessed; ideal "
              f"{r['ideal_bytes'] / 1e9:.2f} GB (weights {r['weight_bytes'] / 1e9:.2f} + live KV {r['kv_bytes'] / 1e9:.2f}); ratio {r['ratio']:.3f}")
        if args.json:
            args.json.write_text(json.dumps({"roofline": r}, indent=1) + "\n")
        return None
    work = workload(args)
    if args.worker == "tunix":
        print(json.dumps(run_tunix_worker(args, args.hf_dir, work)))
        return None

    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        make_weights(args, hf_dir)
        results = {"vt": run_vt(args, hf_dir, work),
                   "transformers": dict(error="skipped") if args.skip_hf else run_hf(args, hf_dir, work)}
        results["tunix"] = (dict(error="skipped") if args.skip_tunix else dict(error="Qwen2 only here")
                            if args.arch == "qwen3" else run_tunix(args, hf_dir))

    wanted = sum(m for _, m in work) * args.n
    print(f"workload: {args.prompts} prompts x {args.n} samples, {wanted} tokens "
          f"({args.prompts // args.long_every} prompts want {args.long}, the rest {args.short}); "
          f"size {args.size} {SIZES[args.size]} ({args.arch}); batch {args.batch_size}")
    for name, r in results.items():
        if "error" in r:
            print(f"  {name:13s} {r['error']}")
            continue
        r["tok_s"] = r["tokens"] / r["seconds"]
        print(f"  {name:13s} {r['tok_s']:9.1f} tokens/s  ({r['seconds']:.2f} s, {r['steps']} decode steps)")
    v = results["vt"]
    print(f"  vt KV pages: pool {v['pool_pages']}, peak in use {v['peak_pages']}, peak needed by live tokens "
          f"{v['peak_pages_needed']}, {v['page_bytes']} bytes each, {v['preemptions']} preemptions; seconds "
          f"prefill {v['prefill_seconds']:.2f} decode {v['decode_seconds']:.2f} host {v['host_seconds']:.2f}")
    vt = v["tok_s"]
    for name in ("transformers", "tunix"):
        if "tok_s" in results[name]:
            results[name]["vt_ratio"] = vt / results[name]["tok_s"]
            print(f"  vt / {name}: {vt / results[name]['tok_s']:.2f}x")
    out = {"throughput": results}
    if args.tools:
        out["tools"] = t = run_tools(args)
        print(f"  tools ({t['samples']} samples, 2 calls each, batch {t['batch']}): policy tokens/s instant "
              f"{t['instant_tok_s']:.1f}, 0.2 s tool {t['slow_tok_s']:.1f}: {t['ratio']:.2f}x (best of 3 each; "
              f"runs instant {[round(r['tok_s'], 1) for r in t['runs']['instant']]} slow "
              f"{[round(r['tok_s'], 1) for r in t['runs']['slow']]}, "
              f"{t['compiles_after_warmup']} compiles after warm-up)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return None


if __name__ == "__main__":
    main()
