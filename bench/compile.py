"""Compile time and compiled temporary memory of vt's programs at real width, shallow vs deep.

    .venv/bin/python bench/compile.py                          # coder-3b widths, 2 and 36 layers, every program
    .venv/bin/python bench/compile.py --what sft,decode --seq 1024 --layers 2,8 --json out.json
    .venv/bin/python bench/compile.py --topology v5p-8 --attention auto --what sft   # for a TPU slice (libtpu)

Every program is compiled ahead of time from abstract inputs (ShapeDtypeStructs carrying their shardings), so
no weights are created and any size compiles on any backend (CPU here). For each program and depth it prints
the seconds from tracing to a finished executable (trace + lower + XLA compile) and the executable's temporary
memory (`compiled.memory_analysis().temp_size_in_bytes`: buffers that are neither arguments nor outputs),
then the depth ratio (deepest / shallowest) per program. Compile time that grows with depth means an unrolled
layer stack: every launch, sweep point and resume pays it.

  sft               vt.train.step.make_train_step: --accum micro-batches x --micro-batch rows x --seq tokens
  rl_logps          vt.rl.step token log-probs (the old-policy pass): --rl-rows x --rl-seq
  rl_step           vt.rl.step.make_rl_step: one MGPO update on --rl-rows x --rl-seq
  prefill           the sampler's prefill (vt.sampling.steps.prefill): --prefill-batch prompts x --prompt tokens
  decode            the sampler's decode loop (vt.sampling.steps.decode): --sampler-batch slots, --cache slots
  init_model        vt.model.create_model's random init (its jitted program, traced under an outer jit)
  init_train_state  vt.train.state.init_train_state: AdamW moments around the parameters, in their sharding
  sft_lora, rl_step_lora, init_train_state_lora
                    the same with LoRA adapters of --lora-rank on every projection (vt.model.lora), the frozen
                    base weights in --lora-base-dtype: only the adapters have gradients and AdamW moments

The training rows (sft, rl_step, init_train_state and their _lora forms) also report `state_bytes`: the
parameters + optimiser state + gradients the step holds (all devices together), from the abstract train state.

The SFT and RL programs use fp32 master weights and bf16 compute with --remat (full) and --attention (xla);
the sampler bf16 weights. On CPU, memory_analysis() reports what is materialised, not what remat saves.
The persistent compilation cache is off: every number is a cold compile.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROGRAMS = ("sft", "rl_logps", "rl_step", "prefill", "decode", "init_model", "init_train_state",
            "sft_lora", "rl_step_lora", "init_train_state_lora")
DEFAULT_PROGRAMS = PROGRAMS[:7]
TRAIN_STATE_PROGRAMS = ("sft", "rl_step", "init_train_state")  # and their _lora forms


def _timed(build):
    """(seconds, compiled) of `build()`, which traces, lowers and compiles one program."""
    t0 = time.perf_counter()
    compiled = build()
    return time.perf_counter() - t0, compiled


def compile_sft(args, cfg, mesh):
    from vt.plan import programs as pg
    return _timed(pg.sft_step(pg.train_setup(cfg, mesh), mesh, args.accum, args.micro_batch, args.seq))


def compile_rl_logps(args, cfg, mesh):
    from vt.plan import programs as pg
    return _timed(pg.rl_logps(pg.train_setup(cfg, mesh), mesh, args.rl_rows, args.rl_seq))


def compile_rl_step(args, cfg, mesh):
    from vt.plan import programs as pg
    ts = pg.train_setup(cfg, mesh)
    # one micro-batch's gradient accumulation (the memory-heavy program, whose numbers are reported) plus the
    # optimiser apply
    accumulate = pg.rl_update(ts, mesh, args.rl_rows, args.rl_seq, eps_high=0.28)
    apply = pg.rl_update(ts, mesh, args.rl_rows, args.rl_seq, eps_high=0.28, part="apply")
    return _timed(lambda: (apply(), accumulate())[1])


STEPS_PER_CALL = 8  # decode steps per call


def _sampler(args, cfg, mesh):
    """The sampler's programs for --sampler-batch slots and a pool holding --cache tokens for each."""
    from vt.plan import programs as pg
    from vt.sampling.config import SamplerConfig
    sc = SamplerConfig(batch_size=args.sampler_batch, steps_per_call=STEPS_PER_CALL)
    pages = -(-args.cache // sc.page_size)
    return pg.sampler_setup(cfg, mesh, sc), args.sampler_batch * pages, pages


def compile_prefill(args, cfg, mesh):
    from vt.plan import programs as pg
    ss, pool, _ = _sampler(args, cfg, mesh)
    return _timed(pg.prefill(ss, mesh, pool, args.prefill_batch, args.prompt))


def compile_decode(args, cfg, mesh):
    from vt.plan import programs as pg
    ss, pool, pages = _sampler(args, cfg, mesh)
    return _timed(pg.decode(ss, mesh, pool, pages))


def compile_init_model(args, cfg, mesh):
    import jax
    from flax import nnx
    from vt.model.qwen2 import create_model, model_shardings

    # create_model jits its own init program; tracing it under an outer jit compiles exactly that program
    # (whatever create_model does inside) without running it, so no weights are ever created.
    def build():
        return jax.jit(lambda: nnx.state(create_model(cfg, mesh, seed=0)),
                       out_shardings=model_shardings(cfg, mesh)).lower().compile()
    return _timed(build)


def compile_init_train_state(args, cfg, mesh):
    import jax
    from vt.plan import programs as pg
    from vt.train.state import init_train_state
    ts = pg.train_setup(cfg, mesh)
    optimizer, sh, abstract = ts.optimizer, ts.sh, ts.abstract

    def build():
        return jax.jit(lambda p: init_train_state(p, optimizer, sh), in_shardings=(sh.params,),
                       out_shardings=sh).lower(abstract.params).compile()
    return _timed(build)


COMPILERS = {"sft": compile_sft, "rl_logps": compile_rl_logps, "rl_step": compile_rl_step,
             "prefill": compile_prefill, "decode": compile_decode, "init_model": compile_init_model,
             "init_train_state": compile_init_train_state}
COMPILERS |= {f"{what}_lora": COMPILERS[what] for what in TRAIN_STATE_PROGRAMS}


def _nbytes(tree) -> int:
    import jax
    import numpy as np
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def state_bytes(cfg, mesh) -> int:
    """Parameters + optimiser state + the fp32 gradients of the trainable parameters (vt.model.lora.trainable)."""
    import numpy as np
    from vt.model.lora import trainable
    from vt.plan import programs as pg
    abstract = pg.train_setup(cfg, mesh).abstract
    grads = sum(int(np.prod(x.shape)) * 4 for x in trainable(abstract.params).values())
    return _nbytes(abstract.params) + _nbytes(abstract.opt_state) + grads


def model_config(args, what: str, layers: int):
    from vt.model.config import preset
    if what in ("prefill", "decode"):
        dtypes = dict(param_dtype="bfloat16", dtype="bfloat16", attention_impl="xla")
    elif what.endswith("_lora"):
        dtypes = dict(param_dtype=args.lora_base_dtype, dtype="bfloat16", remat_policy=args.remat,
                      attention_impl=args.attention, lora_rank=args.lora_rank, lora_alpha=2.0 * args.lora_rank)
    else:
        dtypes = dict(param_dtype="float32", dtype="bfloat16", remat_policy=args.remat, attention_impl=args.attention)
    return preset(args.preset, num_layers=layers, **dtypes)


def _gb(n) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def table(rows: list[dict]) -> str:
    by_what: dict[str, list[dict]] = {}
    for r in rows:
        by_what.setdefault(r["what"], []).append(r)
    head = ("what", "layers", "compile s", "temp", "state", "depth ratio (compile / temp)")
    body = []
    for what, rs in by_what.items():
        lo, hi = min(rs, key=lambda r: r["layers"]), max(rs, key=lambda r: r["layers"])
        for r in rs:
            ratio = ""
            if r is hi and hi is not lo and r.get("compile_s") and lo.get("compile_s"):
                temp = (f"{hi['temp_bytes'] / lo['temp_bytes']:.2f}x" if hi.get("temp_bytes") and lo.get("temp_bytes")
                        else "-")
                ratio = f"{hi['compile_s'] / lo['compile_s']:.2f}x / {temp}  ({hi['layers']} vs {lo['layers']})"
            s = "-" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
            body.append((what, str(r["layers"]), s if not r.get("error") else f"FAILED: {r['error']}",
                         _gb(r.get("temp_bytes")), _gb(r.get("state_bytes")), ratio))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, body)])


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-coder-3b")
    ap.add_argument("--layers", default="2,36", help="comma-separated depths (num_layers override of the preset)")
    ap.add_argument("--what", default=",".join(DEFAULT_PROGRAMS), help=f"comma-separated subset of {','.join(PROGRAMS)}")
    ap.add_argument("--seq", type=int, default=4096, help="SFT tokens per row")
    ap.add_argument("--accum", type=int, default=2, help="SFT micro-batches per step")
    ap.add_argument("--micro-batch", type=int, default=4, help="SFT rows per micro-batch")
    ap.add_argument("--rl-rows", type=int, default=4)
    ap.add_argument("--rl-seq", type=int, default=4096)
    ap.add_argument("--prefill-batch", type=int, default=8, help="prompts per prefill call")
    ap.add_argument("--prompt", type=int, default=1024, help="padded prompt length of a prefill call")
    ap.add_argument("--sampler-batch", type=int, default=64, help="decode slots")
    ap.add_argument("--cache", type=int, default=4096, help="KV cache slots per decode slot")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--attention", default="xla", help="attention of the SFT and RL programs")
    ap.add_argument("--lora-rank", type=int, default=64, help="rank of the _lora programs' adapters")
    ap.add_argument("--lora-base-dtype", default="bfloat16", choices=["float32", "bfloat16"],
                    help="dtype of the _lora programs' frozen base weights")
    ap.add_argument("--topology", default="",
                    help="compile for this TPU topology (vt plan's names: v5p-8, v6e-8, ...) with libtpu's "
                         "compile-only devices instead of this host's devices")
    ap.add_argument("--json", default="", help="write the rows to this file")
    args = ap.parse_args(argv)
    args.layer_list = [int(x) for x in args.layers.split(",") if x]
    args.programs = [x for x in args.what.split(",") if x]
    unknown = sorted(set(args.programs) - set(PROGRAMS))
    if unknown:
        ap.error(f"--what: unknown program(s) {unknown}; choose from {','.join(PROGRAMS)}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import jax
    jax.config.update("jax_enable_compilation_cache", False)  # cold compiles only
    from vt.sharding import MeshConfig, make_mesh

    devices = jax.devices()
    if args.topology:
        import os
        from vt.plan import topology
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        devices = topology.devices(topology.parse(args.topology))
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), devices)
    dev = devices[0]
    print(f"compile: {len(devices)} x {dev.device_kind} ({dev.platform}), jax {jax.__version__}, "
          f"{args.preset}", flush=True)
    rows = []
    for what in args.programs:
        for layers in args.layer_list:
            cfg = model_config(args, what, layers)
            row = {"what": what, "layers": layers, "compile_s": None, "temp_bytes": None}
            if what.removesuffix("_lora") in TRAIN_STATE_PROGRAMS:
                row["state_bytes"] = state_bytes(cfg, mesh)
            try:
                seconds, compiled = COMPILERS[what](args, cfg, mesh)
                mem = compiled.memory_analysis()
                row.update(compile_s=seconds, temp_bytes=None if mem is None else int(mem.temp_size_in_bytes))
            except Exception as e:  # one program failing must not hide the others' numbers
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(f"compile: {what} {layers} layers: "
                  + (row.get("error") or f"{row['compile_s']:.1f} s, temp {_gb(row['temp_bytes'])}, "
                   f"state {_gb(row.get('state_bytes'))}"), flush=True)
            rows.append(row)
            if args.json:  # written as it goes: a long run interrupted still leaves its numbers
                Path(args.json).write_text(json.dumps(rows, indent=2))
    print()
    print(table(rows))
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
