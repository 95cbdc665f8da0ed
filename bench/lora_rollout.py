"""Rollouts with LoRA adapters: decode with the adapters applied at every projection vs merged into a copy of the
weights once per update (what vt.rl.learner does), same weights, same workload, side by side.

    .venv/bin/python bench/lora_rollout.py [--size tiny|small] [--rank 16] [--prompts 32] [--new 64] [--rounds 3]

Each round times, for both forms, one weight update plus one rollout batch: "applied" hands the engine the
adapted model's state (nothing to compute at an update; every decode step runs x A B at each projection);
"merged" jits W + (alpha / r) A B for every adapted kernel (vt.model.lora.merged_params) and hands the engine
the plain model's state. Both engines compile and warm up first. Prints tokens/s per form and the ratio.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small", choices=["tiny", "small"])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=64, help="new tokens per sample")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    from flax import nnx
    from vt.checkpoint.params import flat_params
    from vt.model import lora
    from vt.model.config import preset
    from vt.model.qwen2 import create_model
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    from vt.train.state import ModelDef

    over = {} if args.size == "tiny" else dict(hidden_size=512, intermediate_size=1408, num_layers=8, num_heads=8,
                                               num_kv_heads=2, vocab_size=4096)
    cfg = preset("tiny", **over, lora_rank=args.rank, lora_alpha=2.0 * args.rank)
    model = create_model(cfg, seed=0)
    params = flat_params(model)
    md, base_md = ModelDef(cfg), ModelDef(lora.base_config(cfg))
    merge = jax.jit(lambda p: lora.merged_params(p, cfg))
    sc = SamplerConfig(batch_size=args.prompts, max_new_tokens=args.new, temperature=1.0)
    rng = np.random.default_rng(0)
    requests = [Request(rng.integers(4, cfg.vocab_size, int(rng.integers(16, 48))).tolist()) for _ in range(args.prompts)]

    forms = {"applied": (md.graphdef, lambda p: nnx.state(md.bind(p))),
             "merged": (base_md.graphdef, lambda p: nnx.state(base_md.bind(merge(p))))}
    engines = {name: Engine((g, weights(params)), sc) for name, (g, weights) in forms.items()}
    for e in engines.values():  # compile and warm up
        e.generate(requests, seed=0)
    times = {name: [] for name in forms}
    for r in range(args.rounds):
        for name, (_, weights) in forms.items():
            t0 = time.perf_counter()
            engines[name].update_weights(jax.block_until_ready(weights(params)))
            engines[name].generate(requests, seed=r + 1)
            times[name].append(time.perf_counter() - t0)
    tokens = args.prompts * args.new
    best = {name: min(t) for name, t in times.items()}
    print(f"lora_rollout: {args.size}, rank {args.rank}, {args.prompts} prompts x {args.new} new tokens, "
          f"best of {args.rounds} (update + rollout), jax {jax.__version__} on {jax.devices()[0].platform}")
    for name, t in best.items():
        print(f"  {name:8s} {tokens / t:9.1f} tokens/s  ({t:.3f} s)")
    print(f"  merged / applied tokens/s: {best['applied'] / best['merged']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
