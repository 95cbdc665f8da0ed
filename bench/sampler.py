"""Rollout tokens/s: vt's engine vs transformers `generate` vs the Tunix sampler, same weights, same workload.

    .venv/bin/python bench/sampler.py [--prompts 64] [--n 4] [--batch-size 64] [--short 32] [--long 256]
                                      [--long-every 8] [--size tiny|small] [--skip-tunix] [--skip-hf]
    .venv/bin/python bench/sampler.py --setup-tunix     # once: a separate venv with google-tunix (see below)

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
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(**SIZES[args.size], max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.5)
    model.save_pretrained(out)


def run_vt(args, hf_dir: Path, work) -> dict:
    from vt.checkpoint.params import model_from_hf
    from vt.sampling import Engine, Request, SamplerConfig
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
    return dict(seconds=dt, tokens=tokens, steps=engine.last_stats.decode_steps, compiles=compiles)


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
    ap.add_argument("--skip-tunix", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--setup-tunix", action="store_true")
    ap.add_argument("--worker", choices=["tunix"], help=argparse.SUPPRESS)
    ap.add_argument("--hf-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setup_tunix:
        return setup_tunix()
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
        results["tunix"] = dict(error="skipped") if args.skip_tunix else run_tunix(args, hf_dir)

    wanted = sum(m for _, m in work) * args.n
    print(f"workload: {args.prompts} prompts x {args.n} samples, {wanted} tokens "
          f"({args.prompts // args.long_every} prompts want {args.long}, the rest {args.short}); "
          f"size {args.size} {SIZES[args.size]}; batch {args.batch_size}")
    for name, r in results.items():
        if "error" in r:
            print(f"  {name:13s} {r['error']}")
            continue
        r["tok_s"] = r["tokens"] / r["seconds"]
        print(f"  {name:13s} {r['tok_s']:9.1f} tokens/s  ({r['seconds']:.2f} s, {r['steps']} decode steps)")
    vt = results["vt"]["tok_s"]
    for name in ("transformers", "tunix"):
        if "tok_s" in results[name]:
            print(f"  vt / {name}: {vt / results[name]['tok_s']:.2f}x")
    return None


if __name__ == "__main__":
    main()
