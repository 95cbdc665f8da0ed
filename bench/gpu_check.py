"""GPU runbook: on one NVIDIA GPU, the coder-3b shape with random weights, vt's three checks and the transformers +
PyTorch peers at the same shapes, one table with ratios, meant to finish within 6 minutes on an H200.

    .venv/bin/python bench/gpu_check.py                 # H100/H200: SFT MFU, sampler bandwidth, RL step, peers
    .venv/bin/python bench/gpu_check.py --json out.json # also write the numbers
    .venv/bin/python bench/gpu_check.py --tiny          # CPU smoke test of this script (numbers meaningless)

  sft      one optimiser step of the real SFT train step (vt.train.step): fp32 master weights and AdamW, bf16
           compute, `--attention` (cuDNN flash attention by default), full remat, --batch rows of --seq tokens
           in --accum micro-batches. MFU = model FLOPs per step (ModelConfig.flops_per_token: 6 N per token
           plus attention) / step time / --peak-flops (H100/H200 dense bf16: 989 TFLOP/s). Goal >= 45%.
  sampler  vt.sampling.Engine, bf16 weights, --sampler-batch slots, --prompt random prompt tokens, --new tokens
           each (no stop tokens, so every slot decodes to the end). Tokens/s of the whole generate call and the
           fraction of the HBM-bandwidth bound: per decode step the weights are read once and each slot's keys
           and values up to its current length (average prompt + new/2), bytes / step time / --hbm-bw
           (H200: 4.8 TB/s). Goal > 60%.
           `--decode-attention auto,pallas` times the sampler once per decode kernel (SamplerConfig.decode_attention),
           side by side, with the step-time ratio.
  attention  cuDNN flash attention alone at the sft check's micro-batch (forward + backward) in three forms: vt's
           dense causal & segment mask (today), that mask plus is_causal, and is_causal alone; times and ratios.
  rl       one MGPO update (vt.rl.step): the old-policy log-prob pass plus the clipped-surrogate step on
           --rl-rows rows of --rl-seq tokens, with the SFT check's train state.

  torch-sft       the peer a user would pick instead, in the same run at the sft check's shape: transformers
                  Qwen2ForCausalLM + PyTorch, fp32 master weights, bf16 autocast, fused AdamW (CUDA), gradient
                  checkpointing, sdpa attention; printed as vt / torch tokens/s.
  torch-generate  transformers `generate` at the sampler check's shape (bf16, sampling, no stop tokens); vt / torch.

`--variant-xla-flags=FLAGS` runs the `--variant-only` checks once more in a child process whose XLA_FLAGS add FLAGS
(XLA reads its flags when the backend starts; the child runs before this process's JAX takes the GPU), as rows
named check[+flags] with their step time against the same check without them.

The torch peers run first, in a child process that exits before JAX starts (JAX reserves most of the GPU's memory
at start-up; two frameworks cannot share it). Each check runs on its own; one that fails is reported in the table
with its error, and the others still run. XLA flags for NVIDIA GPUs come from vt/distributed.py
(NVIDIA_XLA_FLAGS), set before the backend starts. JAX's persistent compilation cache is on
(--compilation-cache, default ~/.cache/vt/jax-compilation-cache): a second run of the same shapes skips XLA
compilation; `first step s` is the seconds from the script's launch to the check's first finished step, and
`compile_s` the seconds spent compiling (or loading from the cache). `--profile K` runs one more step of each
check under jax.profiler and prints its K costliest device operations (kernel name, total ms, count): to map a
kernel to its source, rerun with XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text" and look the fusion up
in DIR/*jit_traced*gpu_after_optimizations.txt (each instruction's op_name says which jax operation it is).

Measured on one H200 (2026-12-04, jax 0.11.2 + CUDA 13, flax 0.12.12, torch 2.11, transformers 5.17; the
defaults; whole run 113 s from launch, the peers 62 s of it; main at 5f42c40):

  check           s/step  throughput    efficiency
  sampler         0.0203  12,621 tok/s  HBM 10.0% of 4.8 TB/s   (goal > 60%)   vt / torch generate 3.21x
  sft             2.0520  15,969 tok/s  MFU 35.7%               (goal >= 45%)  vt / torch 1.01x (torch MFU 35.3%,
                                                                               peak 90 GB)
  rl              0.5755  14,234 tok/s  MFU 39.0%

What the decode step's 20 ms were (a --profile-style trace of one 512-token generate, 511 steps, and the optimized
HLO; bytes per step: 6.2 GB of weights + 3.6 GB of live KV, 2.0 ms at 4.8 TB/s):
- every layer of every step copied its layer's whole K and V page pool out of the scan's carry before gathering
  pages from it (loop_dynamic_slice_fusion, bf16[1, 2, pages, 16, 128] x 2, 96 us a layer, 3.5 ms a step):
  fixed after this run by gathering (layer, page) in one index (vt.model.kv_pages.gather_pages); a probe that gathered
  (layer, page) directly (into another layout, before this form) measured the step at 256 new tokens
  16.3 / 16.7 -> 14.1 ms (-14%); the committed form itself is not yet measured on a GPU. The CPU compile shows that copy
  as temp memory growing with the pool: tests/sampling/test_pages.py guards it.
- XLA's dot merger concatenated each layer's gate and up weights into one [2048, 22016] operand every step
  (input_concatenate_fusion, 42 us a layer, 1.5 ms a step), and q/k/v likewise ([2048, 2560]): a candidate flag is
  --xla_gpu_dot_merger_threshold_mb=0 (this jaxlib knows it), not yet measured.
- the page-block loop's trip count is decided on device (the batch's longest position), so each of its
  iterations reads the loop predicate back to the host: ~164 device-to-host copies a step. Reading every block
  with a fixed trip count was faster at 3 blocks (16.3 -> 14.4 ms) but reads all max_len / 128 blocks, which
  long-context sampling cannot afford; not changed.
- the gathered page blocks are materialised (a fused gather + transpose, 18 us a block) before their matmuls, and
  the matmuls themselves (nvjet) are far from the bandwidth bound at these shapes.
  After this run: SamplerConfig.decode_attention="pallas" takes JAX's Pallas GPU paged-attention kernel instead of
  the loop (one launch a layer, no host round trips; equal to the XLA path on CPU under Pallas's interpreter).
  The next device run, one command (rehearsed with --tiny: 56 s on the 2-core CPU box):
    python3 bench/gpu_check.py --profile 25 --decode-attention auto,pallas --json $OUT/gpu_check.json \
        --variant-xla-flags=--xla_gpu_dot_merger_threshold_mb=0 --variant-only sampler,sft,rl
The SFT step (one profiled step, 2.03 s of kernels): cuDNN flash attention backward 375 ms (72 calls: 36 layers x 2
micro-batches) and forward 259 ms (144: the forward and its rematerialisation), 31% together; bf16 GEMMs most of
the rest; 137 ms of float32 (TF32) GEMMs in 16 calls: the chunked loss's backward, whose float32 logit gradient
meets the head in float32 (torch's autocast casts it to bf16 first): a candidate, not yet measured. The attention
kernels ran at ~150 TFLOP/s of causal work (2.75e11 FLOPs a forward call in 1.8 ms): vt hands cuDNN the causal &
same-segment rule as a dense mask, which jax turns into an additive bias (not differentiated: a boolean mask), so
cuDNN computes every block above the diagonal too (is_causal is not set). The attention check times the
alternatives.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAUNCH = time.perf_counter()  # the script's start: `first_step_s` counts from here
H200_PEAK_FLOPS = 989e12  # dense bf16, per GPU
H200_HBM_BW = 4.8e12  # bytes/s


@dataclasses.dataclass
class Row:
    check: str
    shape: str
    seconds: float | None = None  # per step (sft, rl) or per decode step (sampler)
    throughput: str = ""
    efficiency: str = ""
    numbers: dict = dataclasses.field(default_factory=dict)
    error: str = ""


def _block(tree):
    import jax
    jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)
    return tree


def device_profile(fn, top: int) -> list:
    """Run `fn` once under jax.profiler and return its `top` device operations by total time:
    [(name, milliseconds, count)], from the trace's device planes (GPU kernels; on CPU, XLA's host threads)."""
    import collections
    import glob
    import tempfile
    import jax
    from jax.profiler import ProfileData
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            fn()
        data = ProfileData.from_file(glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0])
        total, count = collections.Counter(), collections.Counter()
        planes = [p for p in data.planes if p.name.startswith("/device:")] or [
            p for p in data.planes if p.name.startswith("/host:CPU")]
        for plane in planes:
            for line in plane.lines:
                if line.name in ("XLA Modules", "Steps", "python", "XLA TraceMe"):  # spans of the ops below, not ops
                    continue
                for ev in line.events:
                    if ev.name.startswith("ThunkExecutor"):  # CPU: the executor's span around the ops
                        continue
                    total[ev.name] += ev.duration_ns
                    count[ev.name] += 1
    return [(name, ns / 1e6, count[name]) for name, ns in total.most_common(top)]


def print_profile(check: str, ops: list) -> None:
    busy = sum(ms for _, ms, _ in ops)
    print(f"gpu_check: {check}: top {len(ops)} device operations of one profiled step ({busy:.1f} ms among them)")
    for name, ms, n in ops:
        print(f"  {ms:10.3f} ms  x{n:<7d} {name[:110]}")


def model_cfg(args, **changes):
    from vt.model.config import preset
    return preset("tiny" if args.tiny else "qwen2.5-coder-3b", **changes)


def random_rows(rng, vocab: int, shape) -> dict:
    """Packed-row batch layout of vt.data.packing, one document per row, loss on every target."""
    import numpy as np
    T = shape[-1]
    ids = rng.integers(0, vocab, size=shape).astype(np.int32)
    return {"input_ids": ids, "targets": np.roll(ids, -1, axis=-1), "loss_mask": np.ones(shape, np.float32),
            "segment_ids": np.ones(shape, np.int32),
            "positions": np.broadcast_to(np.arange(T, dtype=np.int32), shape).copy()}


def check_sft(args, mesh, out: dict) -> Row:
    import jax
    import numpy as np
    from vt.checkpoint.params import flat_params
    from vt.model.qwen2 import create_model
    from vt.train.optim import OptimConfig, make_optimizer
    from vt.train.state import ModelDef, abstract_train_state, init_train_state, train_state_shardings
    from vt.distributed import global_batch
    from vt.train.step import as_microbatches, batch_sharding, make_train_step

    cfg = model_cfg(args, param_dtype="float32", dtype="bfloat16", remat_policy=args.remat,
                    attention_impl=args.attention)
    B, A, T = args.batch, args.accum, args.seq
    row = Row("sft", f"{'tiny' if args.tiny else 'coder-3b'} {B}x{T} tokens, {A} micro-batches, remat {args.remat}, "
                     f"attention {args.attention}")
    optimizer, schedule = make_optimizer(OptimConfig(lr=1e-5), 1000)
    md = ModelDef(cfg)
    sh = train_state_shardings(md, optimizer, mesh)
    state = init_train_state(flat_params(create_model(cfg, mesh, seed=0)), optimizer, sh)
    t0 = time.perf_counter()
    step = make_train_step(md, optimizer, schedule, sh, abstract_train_state(md, optimizer, sh), mesh, A, B // A, T)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    rows = {k: v.reshape(A, B // A, T) for k, v in random_rows(rng, cfg.vocab_size, (B, T)).items()}
    batch = global_batch(as_microbatches(rows), batch_sharding(mesh), row_axis=1)
    state, m = _block(step(state, batch))  # first run: allocation and autotuning
    first_step_s = time.perf_counter() - LAUNCH
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, m = _block(step(state, batch))
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    if args.profile:
        def profiled():  # the step donates its state: keep the new one (the rl check trains on from it)
            nonlocal state
            state, _ = _block(step(state, batch))
        row.numbers["profile"] = device_profile(profiled, args.profile)
    flops = cfg.flops_per_token(T) * B * T
    mfu = flops / dt / (args.peak_flops * jax.device_count())
    row.seconds = dt
    row.throughput = f"{B * T / dt:,.0f} tok/s"
    row.efficiency = f"MFU {100 * mfu:.1f}% of {args.peak_flops / 1e12:.0f} TFLOP/s"
    row.numbers = dict(step_s=dt, tokens_per_s=B * T / dt, mfu=mfu, model_flops_per_step=flops,
                       compile_s=compile_s, first_step_s=first_step_s, loss=float(m["loss"]), **row.numbers)
    out["sft"] = (md, optimizer, schedule, sh, state)
    return row


def check_sampler(args, mesh, kernel: str = "auto") -> Row:
    import numpy as np
    from vt.model.config import param_count
    from vt.model.qwen2 import create_model
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine

    cfg = model_cfg(args, param_dtype="bfloat16", dtype="bfloat16", attention_impl="xla")
    B, P, N = args.sampler_batch, args.prompt, args.new
    row = Row("sampler" if kernel == "auto" else f"sampler:{kernel}", f"batch {B}, prompt {P} + {N} new tokens, bf16")
    engine = Engine(create_model(cfg, mesh, seed=0),
                    SamplerConfig(batch_size=B, max_new_tokens=N, temperature=1.0, stop_token_ids=(),
                                  steps_per_call=args.steps_per_call, decode_attention=kernel), mesh=mesh)
    rng = np.random.default_rng(0)
    requests = [Request(prompt_ids=rng.integers(0, cfg.vocab_size, P).tolist()) for _ in range(B)]
    t0 = time.perf_counter()
    engine.generate(requests, seed=0)  # compiles prefill / insert / decode for these shapes
    compile_s = time.perf_counter() - t0
    engine.generate(requests, seed=1)
    s = engine.last_stats
    if args.profile:
        row.numbers["profile"] = device_profile(lambda: engine.generate(requests, seed=2), args.profile)
    step_s = s.seconds / max(s.decode_steps, 1)
    weight_bytes = param_count(cfg, padded=True) * 2
    avg_len = P + N / 2
    kv_bytes = 2 * cfg.num_layers * B * avg_len * cfg.num_kv_heads * cfg.head_dim * 2
    frac = (weight_bytes + kv_bytes) / step_s / args.hbm_bw
    row.seconds = step_s
    row.throughput = f"{s.tokens / s.seconds:,.0f} tok/s"
    row.efficiency = f"HBM {100 * frac:.1f}% of {args.hbm_bw / 1e12:.1f} TB/s"
    row.numbers = dict(decode_step_s=step_s, tokens_per_s=s.tokens / s.seconds, hbm_fraction=frac,
                       bytes_per_step=weight_bytes + kv_bytes, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
                       decode_steps=s.decode_steps, tokens=s.tokens, seconds=s.seconds, compile_s=compile_s,
                       **row.numbers)
    return row


def check_attention(args, mesh) -> Row:
    """cuDNN flash attention at the SFT check's micro-batch shape (coder-3b heads, bf16), forward + backward, in the
    forms `jax.nn.dot_product_attention` can take: vt's today (vt.model.attention: the causal & same-segment rule
    as a dense boolean mask, which cuDNN applies as an additive bias over every block), the same mask plus
    is_causal=True (whether cuDNN then skips the blocks above the diagonal), and is_causal alone (no mask: rows
    of one segment). Rows here are one segment each, so all three compute the same attention: their outputs
    must agree. Off NVIDIA GPUs the same calls run JAX's XLA form (`--tiny` rehearses the script only)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from vt.model.attention import resolve
    cfg = model_cfg(args)
    B, T, N, K, H = args.batch // args.accum, args.seq, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    row = Row("attention", f"{B}x{T}, {N} heads / {K} KV heads x {H}, bf16, forward + backward")
    impl = "cudnn" if resolve("jax", jnp.bfloat16) == "cudnn" else None
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.standard_normal((B, T, n, H)), jnp.bfloat16) for n in (N, K, K))
    seg = jnp.ones((B, T), jnp.int32)
    mask = (jnp.tril(jnp.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :]))[:, None]

    def make(with_mask, causal):
        def loss(q, k, v):
            out = jax.nn.dot_product_attention(q, k, v, mask=mask if with_mask else None, is_causal=causal,
                                               scale=H ** -0.5, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) ** 2), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

    forms = {"mask": (True, False), "mask+causal": (True, True), "causal": (False, True)}
    times, outs = {}, {}
    for name, (with_mask, causal) in forms.items():
        try:
            f = make(with_mask, causal)
            (_, outs[name]), _ = _block(f(q, k, v))
            ts = []
            for _ in range(max(args.steps, 3)):
                t0 = time.perf_counter()
                _block(f(q, k, v))
                ts.append(time.perf_counter() - t0)
            times[name] = sorted(ts)[len(ts) // 2]
        except Exception as e:  # a form cuDNN refuses is a finding, not a failed runbook
            times[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    ok = {n: t for n, t in times.items() if isinstance(t, float)}
    if "mask" not in ok:
        raise RuntimeError(f"today's form failed: {times['mask']}")
    diff = {n: float(jnp.max(jnp.abs(outs[n].astype(jnp.float32) - outs["mask"].astype(jnp.float32))))
            for n in ok if n != "mask"}
    row.seconds = ok["mask"]
    row.throughput = ", ".join(f"{n} {1e3 * t:.2f} ms" if isinstance(t, float) else f"{n} FAILED"
                               for n, t in times.items())
    row.efficiency = ", ".join(f"{n} {ok['mask'] / t:.2f}x" for n, t in ok.items() if n != "mask") + " vs mask"
    row.numbers = dict(seconds=times, max_abs_diff_vs_mask=diff, implementation=impl or "xla")
    return row


def check_rl(args, mesh, sft) -> Row:
    import numpy as np
    from vt.rl.step import make_rl_step, make_token_logps, row_sharding

    md, optimizer, schedule, sh, state = sft
    N, T = args.rl_rows, args.rl_seq
    row = Row("rl", f"{N} rows x {T} tokens: old-policy log-probs + one MGPO update")
    rng = np.random.default_rng(1)
    r = random_rows(rng, md.cfg.vocab_size, (N, T))
    mask = np.zeros((N, T), np.float32)
    mask[:, T // 4:] = 1.0  # the first quarter is the prompt
    adv = np.repeat(rng.standard_normal((N, 1)).astype(np.float32), T, axis=1)
    # per-sequence mean: each completion token weighs 1 / (N * its sequence's completion length)
    batch = {"input_ids": r["input_ids"], "targets": r["targets"], "positions": r["positions"],
             "segment_ids": r["segment_ids"], "loss_mask": mask, "adv": adv * mask,
             "weight": (mask / (N * mask.sum(1, keepdims=True))).astype(np.float32)}
    import jax
    batch = jax.device_put(batch, row_sharding(mesh))
    logps = make_token_logps(md, sh.params, mesh, temperature=1.0)
    rl_step = make_rl_step(md, optimizer, schedule, sh, mesh, temperature=1.0, eps_low=0.2, eps_high=0.2,
                           kl_coef=0.0, is_cap=2.0)

    def one(state):
        old = logps(state.params, batch)
        b = dict(batch, old_logp=old, sampler_logp=old)  # on-policy: IS weight 1
        return _block(rl_step(state, [b]))

    t0 = time.perf_counter()
    state, m = one(state)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, m = one(state)
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    if args.profile:
        row.numbers["profile"] = device_profile(lambda: one(state)[1], args.profile)  # the last use of `state`
    # forward (2N) for the old log-probs + forward/backward (6N) for the update
    flops = md.cfg.flops_per_token(T) * N * T * (8 / 6)
    mfu = flops / dt / (args.peak_flops * jax.device_count())
    row.seconds = dt
    row.throughput = f"{N * T / dt:,.0f} tok/s"
    row.efficiency = f"MFU {100 * mfu:.1f}%"
    row.numbers = dict(step_s=dt, tokens_per_s=N * T / dt, mfu=mfu, compile_s=compile_s, loss=float(m["loss"]),
                       **row.numbers)
    return row


# --- the transformers + PyTorch peers (run in a child process: `--worker torch`) -----------------------------------

def _torch_model(args, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from vt.model.config import to_hf_config
    torch.manual_seed(0)
    hf = {k: v for k, v in to_hf_config(model_cfg(args)).items() if k not in ("architectures", "torch_dtype")}
    cfg = Qwen2Config(**hf, attn_implementation="sdpa")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # initialised on the device: a 3B random init on the host takes minutes
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype=dtype), device


def torch_sft(args) -> dict:
    """One optimiser step of the peer SFT loop at the sft check's shape; median of --steps after a first one."""
    import numpy as np
    import torch
    model, device = _torch_model(args, torch.float32)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    B, A, T = args.batch, args.accum, args.seq
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, model.config.vocab_size, (B, T + 1))).to(device)

    def step():
        for chunk in ids.chunk(A):
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(input_ids=chunk[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten()) / A
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    mfu = model_cfg(args).flops_per_token(T) * B * T / dt / args.peak_flops
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return dict(step_s=dt, tokens_per_s=B * T / dt, mfu=mfu, peak_bytes=peak)


def torch_generate(args) -> dict:
    """transformers `generate` at the sampler check's shape: bf16, temperature 1, no stop tokens."""
    import numpy as np
    import torch
    model, device = _torch_model(args, torch.bfloat16)
    model.eval()
    B, P, N = args.sampler_batch, args.prompt, args.new
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, model.config.vocab_size, (B, P))).to(device)

    def generate(new):
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                                 pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return out.shape[1] - P

    generate(4)  # warm-up
    t0 = time.perf_counter()
    steps = generate(N)
    dt = time.perf_counter() - t0
    return dict(decode_step_s=dt / steps, tokens_per_s=B * steps / dt, seconds=dt)


def run_torch_peers(args, wanted) -> dict:
    """{"torch-sft": {...} | {"error": ...}, "torch-generate": ...} from a child process (see the docstring)."""
    import subprocess
    checks = [c for c in ("torch-sft", "torch-generate") if c in wanted]
    if not checks:
        return {}
    settings = json.dumps({**vars(args), "only": ",".join(checks), "json": "", "worker": "torch"})
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", "torch", "--worker-args", settings],
                              capture_output=True, text=True, timeout=args.peer_timeout or None)
    except subprocess.TimeoutExpired:
        why = f"torch worker still running after --peer-timeout {args.peer_timeout:g} s"
        return {c: {"error": why} for c in checks}
    for line in proc.stdout.splitlines():
        if line.startswith("TORCH_RESULT "):
            return json.loads(line[len("TORCH_RESULT "):])
    why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return {c: {"error": f"torch worker failed: {why}"} for c in checks}


def run_flags_variant(args) -> list[Row]:
    """The --variant-only checks again in a child process whose XLA_FLAGS add --variant-xla-flags (XLA reads its
    flags once, when the backend starts), run before this process's JAX takes the GPU. Its rows come back named
    `check[+flags]`; `variant_rows` adds the ratios to this process's rows."""
    import os
    import subprocess
    import tempfile
    if not args.variant_xla_flags:
        return []
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "variant.json"
        settings = dict(vars(args), only=args.variant_only, json=str(out), variant_xla_flags="",
                        decode_attention=args.decode_attention.split(",")[0])  # the parent's shapes and options
        cmd = [sys.executable, __file__, "--worker-args", json.dumps(settings)]
        env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {args.variant_xla_flags}".strip())
        print(f"gpu_check: variant with XLA_FLAGS={env['XLA_FLAGS']!r}: {args.variant_only} ...", flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        print(proc.stdout[-4000:], flush=True)
        if not out.exists():
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            return [Row(f"{c}[+flags]", "", error=f"variant failed: {why}") for c in args.variant_only.split(",")]
        rows = [Row(**r) for r in json.loads(out.read_text())["rows"]]
    for r in rows:
        r.check += "[+flags]"
    return rows


def variant_rows(rows: list[Row], variants: list[Row]) -> list[Row]:
    """The variant rows, each with its step time against the same check without the flags."""
    base = {r.check: r for r in rows if not r.error}
    for v in variants:
        b = base.get(v.check.removesuffix("[+flags]"))
        if b and not v.error and v.seconds:
            v.efficiency += f"; step time {v.seconds / b.seconds:.2f}x {b.check}'s"
    return variants


def torch_worker(args) -> None:
    out = {}
    for name, fn in (("torch-sft", torch_sft), ("torch-generate", torch_generate)):
        if name in args.only.split(","):
            try:
                out[name] = fn(args)
            except Exception as e:  # reported in the parent's table
                traceback.print_exc()
                out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    print("TORCH_RESULT " + json.dumps(out), flush=True)


def peer_rows(rows: list[Row], peers: dict) -> list[Row]:
    """The torch rows, each with its ratio to the vt check at the same shape (vt / torch tokens/s)."""
    vt = {r.check.split(":")[0]: r for r in reversed(rows) if not r.error}  # the first of each check
    out = []
    for name, vt_name in (("torch-sft", "sft"), ("torch-generate", "sampler")):
        if name not in peers:
            continue
        p = peers[name]
        if "error" in p:
            out.append(Row(name, "", error=p["error"]))
            continue
        seconds = p.get("step_s", p.get("decode_step_s"))
        row = Row(name, f"same as {vt_name}", seconds=seconds, throughput=f"{p['tokens_per_s']:,.0f} tok/s",
                  numbers=p)
        if vt_name in vt:
            ratio = vt[vt_name].numbers["tokens_per_s"] / p["tokens_per_s"]
            row.numbers = dict(p, vt_over_torch=ratio)
            row.efficiency = f"vt / torch {ratio:.2f}x tok/s" + (f" (torch MFU {100 * p['mfu']:.1f}%)" if "mfu" in p else "")
        out.append(row)
    return out


def table(rows: list[Row]) -> str:
    head = ("check", "shape", "s/step", "throughput", "efficiency")
    body = [(r.check, r.shape, "-" if r.seconds is None else f"{r.seconds:.4f}", r.throughput,
             r.efficiency if not r.error else f"FAILED: {r.error}") for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, body)])


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model and shapes: a CPU smoke test of this script")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8, help="SFT rows per step")
    ap.add_argument("--accum", type=int, default=2, help="SFT micro-batches per step")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--attention", default="jax", help="xla | jax | splash | auto (SFT and RL checks)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the first (median reported)")
    ap.add_argument("--sampler-batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--steps-per-call", type=int, default=64)
    ap.add_argument("--decode-attention", default="auto",
                    help="the sampler check's decode kernel(s), comma-separated, each timed in turn: auto | xla | "
                         "pallas (vt.sampling.engine.SamplerConfig.decode_attention)")
    ap.add_argument("--rl-rows", type=int, default=4)
    ap.add_argument("--rl-seq", type=int, default=2048)
    ap.add_argument("--peak-flops", type=float, default=H200_PEAK_FLOPS)
    ap.add_argument("--hbm-bw", type=float, default=H200_HBM_BW)
    ap.add_argument("--only", default="sft,sampler,attention,rl,torch-sft,torch-generate",
                    help="comma-separated subset of checks")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="after timing, run one more step of each check under jax.profiler and print its K "
                         "costliest device operations (GPU kernels) with their total time and count")
    ap.add_argument("--variant-xla-flags", default="", metavar="FLAGS",
                    help="also run --variant-only with these XLA flags added (a child process, before this one "
                         "starts JAX), printed as check[+flags] rows; give it with '=' since the value starts with "
                         "'--': --variant-xla-flags=--xla_gpu_dot_merger_threshold_mb=0")
    ap.add_argument("--variant-only", default="sampler", help="the checks the flags variant runs")
    ap.add_argument("--json", default="", help="also write the numbers to this file (rewritten after each check)")
    ap.add_argument("--peer-timeout", type=float, default=300,
                    help="seconds the torch peers may take in all (0: no limit); past it they are reported failed")
    ap.add_argument("--compilation-cache", default=str(Path.home() / ".cache" / "vt" / "jax-compilation-cache"),
                    help="JAX's persistent compilation cache directory ('' turns it off)")
    ap.add_argument("--worker", choices=["torch"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-args", help=argparse.SUPPRESS)  # the parent's settings, as JSON
    args = ap.parse_args(argv)
    if args.worker_args:
        return argparse.Namespace(**json.loads(args.worker_args))
    if args.tiny:
        args.seq, args.batch, args.accum, args.remat, args.attention, args.steps = 64, 4, 2, "none", "xla", 1
        args.sampler_batch, args.prompt, args.new, args.steps_per_call = 8, 8, 16, 8
        args.rl_rows, args.rl_seq = 4, 64
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker == "torch":
        torch_worker(args)
        return 0
    wanted = args.only.split(",")
    peers = run_torch_peers(args, wanted)  # before JAX takes the GPU's memory
    variants = run_flags_variant(args)  # likewise
    if peers:
        print(f"gpu_check: torch peers done at {time.perf_counter() - LAUNCH:.0f} s: {json.dumps(peers)}", flush=True)
    from vt.distributed import apply_nvidia_env, enable_compilation_cache
    if not args.tiny:
        apply_nvidia_env()  # before the first device use
    import jax
    from vt.sharding import MeshConfig, make_mesh
    if args.compilation_cache:
        enable_compilation_cache(args.compilation_cache)

    dev = jax.devices()[0]
    print(f"gpu_check: {jax.device_count()} x {dev.device_kind} ({dev.platform}), jax {jax.__version__}", flush=True)
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    rows, shared = [], {}

    def write_json():
        if args.json:
            Path(args.json).write_text(json.dumps({"device": dev.device_kind, "total_s": time.perf_counter() - LAUNCH,
                                                   "args": vars(args), "peers": peers,
                                                   "rows": [dataclasses.asdict(r) for r in rows]}, indent=2))

    def run(name, fn, *a):
        if name not in wanted:
            return
        print(f"gpu_check: {name} ...", flush=True)
        try:
            rows.append(fn(*a))
        except Exception as e:  # a runbook reports every check; this one's failure must not hide the others
            traceback.print_exc()
            rows.append(Row(name, "", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"))
        # each result as soon as it exists: a run cut off by a time limit still reports what it measured
        if rows[-1].numbers.get("profile"):
            print_profile(name, rows[-1].numbers["profile"])
        done = time.perf_counter() - LAUNCH
        print(f"gpu_check: {name} done at {done:.0f} s: {json.dumps(dataclasses.asdict(rows[-1]))}", flush=True)
        write_json()

    for kernel in args.decode_attention.split(","):  # first: its bf16 model is freed before the SFT state exists
        run("sampler", check_sampler, args, mesh, kernel)
    samplers = [r for r in rows if r.check.startswith("sampler") and not r.error]
    for r in samplers[1:]:
        r.efficiency += f"; step time {r.seconds / samplers[0].seconds:.2f}x {samplers[0].check}'s"
    run("attention", check_attention, args, mesh)
    run("sft", check_sft, args, mesh, shared)
    if "rl" in wanted:
        if "sft" in shared:
            run("rl", check_rl, args, mesh, shared["sft"])
        else:
            rows.append(Row("rl", "", error="needs the sft check's train state"))
    rows += peer_rows(rows, peers) + variant_rows(rows, variants)
    total = time.perf_counter() - LAUNCH
    print()
    print(table(rows))
    print(f"total {total:.0f} s")
    write_json()
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
