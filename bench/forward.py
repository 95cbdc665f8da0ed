"""Forward and forward+backward tokens/s: vt (JAX) vs transformers (PyTorch), same config, same weights, one run.

    .venv/bin/python bench/forward.py [--batch 8] [--seq 256] [--iters 10] [--preset tiny] [--dtype float32]

Absolute numbers on a shared CPU box mean little; the printed ratios (vt / transformers) are the result.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timeit(fn, iters: int) -> float:
    fn()  # warm-up (and compile)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx
    from transformers import AutoModelForCausalLM

    from vt.checkpoint.params import export_to_hf
    from vt.model.config import param_count, preset
    from vt.model.qwen2 import create_model

    torch.set_num_threads(args.threads)
    cfg = preset(args.preset)
    model = create_model(cfg, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        export_to_hf(model, Path(tmp) / "hf", dtype="float32")
        hf = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", dtype=torch.float32, attn_implementation="sdpa")
    hf.eval()

    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
    x_np, y_np = tokens[:, :-1], tokens[:, 1:]
    n_tokens = x_np.size

    graphdef, state = nnx.split(model)
    x, y = jnp.asarray(x_np, jnp.int32), jnp.asarray(y_np, jnp.int32)

    @jax.jit
    def vt_fwd(state, x):
        return nnx.merge(graphdef, state)(x)[0]

    def vt_loss(state, x, y):
        logits = nnx.merge(graphdef, state)(x)[0]
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], -1).mean()

    vt_grad = jax.jit(jax.value_and_grad(vt_loss))

    tx, ty = torch.tensor(x_np), torch.tensor(y_np)

    def hf_fwd():
        with torch.no_grad():
            hf(tx).logits

    def hf_fwd_bwd():
        hf.zero_grad(set_to_none=True)
        logits = hf(tx).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ty.reshape(-1)).backward()

    results = {
        "forward": (timeit(lambda: jax.block_until_ready(vt_fwd(state, x)), args.iters), timeit(hf_fwd, args.iters)),
        "forward+backward": (timeit(lambda: jax.block_until_ready(vt_grad(state, x, y)), args.iters),
                             timeit(hf_fwd_bwd, args.iters)),
    }
    print(f"config {args.preset} ({param_count(cfg):,} params), batch {args.batch} x seq {args.seq}, fp32, "
          f"backend {jax.default_backend()}, torch threads {args.threads}")
    print(f"{'pass':18s} {'vt tok/s':>12s} {'transformers tok/s':>20s} {'ratio vt/hf':>12s}")
    for name, (t_vt, t_hf) in results.items():
        print(f"{name:18s} {n_tokens / t_vt:12,.0f} {n_tokens / t_hf:20,.0f} {t_hf / t_vt:12.2f}x")


if __name__ == "__main__":
    main()
