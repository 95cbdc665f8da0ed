"""`vt plan`: compile a stage's device programs for a TPU topology, without the TPU, and say whether each fits.

A config's programs, at the sizes the run would use (vt.plan.programs builds them from abstract inputs):
    SFT (learner "sft")        the train step: data.grad_accum_steps micro-batches of global_batch_size / accum rows
    RL (learner "rl")          the sampler's prefill and decode (on its own sub-mesh with rollout.sampler_devices),
                               the old-policy log-probs and the update (accumulate, apply) on micro-batches of
                               train.tokens_per_micro_batch at the longest row the sampler can produce
    eval (configs/eval_*.py)   the sampler
    self-distill               the sampler and the scorer
    a recipe (stages: ...)     each enabled stage's programs: SFT and RL stages, profile, select and eval's sampler,
                               self-distill's sampler, scorer and SFT
Per device: arguments + outputs - aliased + temp + generated code (`memory_analysis()` of the TPU compiler's own
executable), plus what stays resident beside it (the AdamW moments while the RL learner samples or scores),
against the device's share of the chip's HBM.
"""
from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from vt import VtError
from vt.buckets import bucket
from vt.checkpoint.params import load_model_config
from vt.config import to_dataclass
from vt.distributed import process_mesh
from vt.io import atomic_write_json
from vt.model.config import ModelConfig, preset
from vt.plan import programs as pg
from vt.plan import topology as tp
from vt.recipe.stages import STAGE_NAMES
from vt.rl.learner import RLConfig
from vt.rl.rollouts import bucket_length
from vt.sampling.config import SamplerConfig
from vt.sampling.page_table import kv_pool_plan
from vt.sharding import MeshConfig, make_mesh
from vt.train.sft import SftConfig

DEFAULT_PRESET = "qwen2.5-coder-3b"  # the model of a stage whose checkpoint is set by the pipeline or absent
PROMPT_TOKENS = 2048  # prompt length assumed for sampler-only stages (eval, profile, select): their data decides


@dataclasses.dataclass
class Program:
    stage: str
    name: str  # e.g. "decode"
    build: Callable[[], object]
    fix: str  # what to change when it does not fit
    resident: int = 0  # bytes per device held beside the program (not among its arguments)
    note: str = ""  # its shapes, for the table


@dataclasses.dataclass
class Stage:
    name: str
    programs: list


# --- model and sizes -------------------------------------------------------------------------------------------

def model_config(model: dict, **dtypes) -> tuple[ModelConfig, str]:
    """The stage's ModelConfig: its checkpoint's model_config.json where the checkpoint exists, else its preset
    (else DEFAULT_PRESET), with the section's dtypes and attention; and where it came from."""
    keys = ("param_dtype", "dtype", "remat_policy", "attention_impl", "lora_rank", "lora_alpha", "lora_dropout",
            "lora_targets")
    over = {k: model[k] for k in keys if k in model} | dtypes
    ckpt = model.get("init_checkpoint") or model.get("ckpt") or ""
    if ckpt and (Path(ckpt) / "model_config.json").exists():
        return load_model_config(ckpt, **over), ckpt
    name = model.get("preset") or DEFAULT_PRESET
    return preset(name, **over), f"preset {name}"


def _processes(devices) -> int:
    return len({d.process_index for d in devices})


def rl_rows(tokens_per_micro_batch: int, T: int, mesh, processes: int) -> int:
    """Rows of a full RL micro-batch, all processes together (vt.rl.learner.micro_batch_sizes' full size)."""
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    unit = math.lcm(shards, processes) // processes
    return max(1, tokens_per_micro_batch // T // processes // unit) * unit * processes


def prefill_shape(cfg: SamplerConfig, prompt: int, M: int) -> tuple[int, int]:
    """(rows, length) of the largest prefill call the engine makes for prompts of up to `prompt` tokens
    (vt.sampling.engine's grouping: rows a power of two >= min_prefill_rows, at most bucket(batch_size), as
    many as keep rows x length within prefill_tokens; one prompt always goes)."""
    T = min(bucket(prompt, cfg.min_prompt_bucket), M * cfg.page_size)
    rows = lambda n: min(bucket(n, cfg.min_prefill_rows), bucket(cfg.batch_size))  # noqa: E731
    n = 1
    while n < cfg.batch_size and rows(n + 1) * T <= cfg.prefill_tokens:
        n += 1
    return rows(n), T


# --- per stage kind ----------------------------------------------------------------------------------------------

def sampler_programs(stage: str, mc: ModelConfig, mesh, cfg: SamplerConfig, prompt: int, hbm: int,
                     resident: int = 0) -> list[Program]:
    """Prefill and decode at `cfg`'s slots, slots as long as `prompt` + max_new_tokens (within the context), the
    KV pool sized as the engine sizes it from the memory left (kv_memory_fraction) beside `resident`."""
    ss = pg.sampler_setup(mc, mesh, cfg)
    context = cfg.max_context or mc.max_position_embeddings
    prompt = min(prompt, context - 1)
    free = max(0, hbm - pg.device_bytes(ss.state) - resident) * mesh.shape["tensor"]  # as free_device_bytes
    # the engine's own sizing of the page table and the pool, for one request as long as the stage allows
    M, _, pool = kv_pool_plan(mc, cfg, [(np.zeros(prompt, np.int32), min(cfg.max_new_tokens, context - prompt), 1)],
                              context, free)
    rows, T = prefill_shape(cfg, prompt, M)
    slots = f"{cfg.batch_size} slots x {M * cfg.page_size} tokens, pool {pool} pages"
    return [
        Program(stage, "prefill", pg.prefill(ss, mesh, pool, rows, T),
                f"lower the sampler's prefill_tokens (now {cfg.prefill_tokens}: {rows} prompts of {T}) or its KV "
                "pool (kv_pages / kv_memory_fraction), or raise mesh.tensor", resident,
                f"{rows} x {T}, pool {pool} pages"),
        Program(stage, "decode", pg.decode(ss, mesh, pool, M),
                f"lower the sampler's batch_size (now {cfg.batch_size} slots), max_new_tokens or KV pool (kv_pages "
                "/ kv_memory_fraction), or raise mesh.tensor (splits the KV pool)", resident, slots),
    ]


def sft_stage(stage: str, section: dict, devices, hbm: int) -> list[Program]:
    cfg = to_dataclass(SftConfig, _only_fields(SftConfig, section), f"config.{stage}")
    mc, _ = model_config(dataclasses.asdict(cfg.model))
    mesh = make_mesh(cfg.mesh, devices)
    d = cfg.data
    rows = d.global_batch_size // d.grad_accum_steps
    ts = pg.train_setup(mc, mesh, cfg.optim)
    return [Program(stage, "train_step", pg.sft_step(ts, mesh, d.grad_accum_steps, rows, d.seq_len,
                                                     cfg.model.loss_chunk),
                    f"raise data.grad_accum_steps (now {d.grad_accum_steps}: micro-batches of {rows} rows of "
                    f"{d.seq_len}) or mesh.tensor, recompute more (model.remat_policy, now {mc.remat_policy}), or "
                    "train LoRA adapters (model.lora_rank)",
                    note=f"{d.grad_accum_steps} x {rows} x {d.seq_len}")]


def rl_stage(stage: str, section: dict, devices, hbm: int) -> list[Program]:
    cfg = to_dataclass(RLConfig, _only_fields(RLConfig, section), f"config.{stage}")
    mc, _ = model_config(dataclasses.asdict(cfg.model))
    n_sampler = cfg.rollout.sampler_devices
    learner_devices = devices[:len(devices) - n_sampler] if n_sampler else devices
    mesh = make_mesh(cfg.mesh, learner_devices)
    sampler_mesh = process_mesh(cfg.mesh, devices[len(devices) - n_sampler:]) if n_sampler else mesh
    s, m = cfg.rollout.sampler, cfg.mgpo
    context = s.max_context or mc.max_position_embeddings
    T = min(bucket_length(cfg.data.max_prompt_tokens + s.max_new_tokens - 1), context)
    rows = rl_rows(cfg.train.tokens_per_micro_batch, T, mesh, _processes(learner_devices))
    ts = pg.train_setup(mc, mesh, cfg.optim, cfg.train.steps * m.mini_batches)
    moments = pg.device_bytes(ts.abstract.opt_state)
    fix = (f"lower train.tokens_per_micro_batch (now {cfg.train.tokens_per_micro_batch}: {rows} rows of {T}), "
           f"raise mesh.tensor, recompute more (model.remat_policy, now {mc.remat_policy}), or train LoRA adapters "
           "(model.lora_rank)")
    kw = dict(temperature=s.temperature, loss_chunk=cfg.model.loss_chunk)
    upd = dict(eps_low=m.eps_low, eps_high=m.eps_high, kl_coef=m.kl_coef, is_cap=m.is_cap)
    sampler_mc = mc if not mc.lora_rank else dataclasses.replace(mc, lora_rank=0)
    out = sampler_programs(stage, sampler_mc, sampler_mesh, s, cfg.data.max_prompt_tokens, hbm,
                           resident=0 if n_sampler else moments)
    out += [Program(stage, "old_logps", pg.rl_logps(ts, mesh, rows, T, **kw), fix, moments, f"{rows} x {T}"),
            Program(stage, "update", pg.rl_update(ts, mesh, rows, T, **kw, **upd), fix, moments, f"{rows} x {T}"),
            Program(stage, "apply", pg.rl_update(ts, mesh, rows, T, **kw, **upd, part="apply"),
                    "raise mesh.fsdp (shards the optimiser state) or train LoRA adapters (model.lora_rank)")]
    return out


def eval_stage(stage: str, section: dict, devices, hbm: int, fallback: str = DEFAULT_PRESET) -> list[Program]:
    model = dict(section.get("model", {}))
    model["preset"] = model.get("preset") or fallback
    mc, _ = model_config(model, param_dtype=model.get("dtype", "bfloat16"))
    mesh = make_mesh(to_dataclass(MeshConfig, model.get("mesh", {}), f"config.{stage}.model.mesh"), devices)
    cfg = to_dataclass(SamplerConfig, section["sampling"], f"config.{stage}.sampling")
    return sampler_programs(stage, mc, mesh, cfg, PROMPT_TOKENS, hbm)


def self_distill_stage(stage: str, section: dict, devices, hbm: int, fallback: str = DEFAULT_PRESET
                       ) -> list[Program]:
    dtype = section.get("dtype", "bfloat16")
    mc, _ = model_config({"init_checkpoint": section.get("student", ""), "preset": fallback}, param_dtype=dtype,
                         dtype=dtype)
    mesh = make_mesh(to_dataclass(MeshConfig, section.get("mesh", {}), f"config.{stage}.mesh"), devices)
    cfg = to_dataclass(SamplerConfig, section["sampling"], f"config.{stage}.sampling")
    sc = section.get("scoring", {})
    rows, chunk, lo = sc.get("batch_size", 8), sc.get("chunk_tokens", 0), sc.get("min_bucket", 64)
    length = bucket(PROMPT_TOKENS + cfg.max_new_tokens, lo)
    if chunk:
        length = -(-length // chunk) * chunk
    length = min(length, mc.max_position_embeddings)
    out = sampler_programs(stage, mc, mesh, cfg, PROMPT_TOKENS, hbm)
    out.append(Program(stage, "scorer", pg.scorer(mc, mesh, rows, length, chunk),
                       f"lower scoring.batch_size (now {rows}) or scoring.chunk_tokens (now {chunk})",
                       note=f"{rows} x {length}" + (f" in chunks of {chunk}" if 0 < chunk < length else "")))
    return out


def _only_fields(cls, section: dict) -> dict:
    """A recipe stage section less the pipeline's own fields (enabled, profile_k, ...)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in section.items() if k in names}


def stages(raw: dict, devices, hbm: int) -> list[Stage]:
    """The stages a config describes, each with its programs (not yet compiled)."""
    if "stages" in raw:  # a recipe, its stages in the order they run
        out = []
        # stages whose checkpoints the pipeline sets run the SFT stages' architecture
        fallback = raw["stages"].get("sft1", {}).get("model", {}).get("preset") or DEFAULT_PRESET
        for name in sorted(raw["stages"], key=lambda n: STAGE_NAMES.index(n) if n in STAGE_NAMES else len(STAGE_NAMES)):
            section = raw["stages"][name]
            if not section.get("enabled", True):
                continue
            if name == "self_distill":
                out.append(Stage(f"{name}.distill", self_distill_stage(f"{name}.distill", section["distill"],
                                                                     devices, hbm, fallback)))
                out.append(Stage(f"{name}.sft", sft_stage(f"{name}.sft", section["sft"], devices, hbm)))
            elif "learner" in section:
                out.append(Stage(name, (sft_stage if section["learner"] == "sft" else rl_stage)(
                    name, section, devices, hbm)))
            elif "benchmarks" in section:
                for bench, bsec in section["benchmarks"].items():
                    out.append(Stage(f"{name}.{bench}", eval_stage(f"{name}.{bench}", bsec, devices, hbm, fallback)))
            elif "sampler" in section:  # profile, select: the SFT model's sampler
                dtype = raw["stages"].get("sft1", {}).get("model", {}).get("dtype", "bfloat16")
                mc, _ = model_config({"preset": fallback}, param_dtype=dtype, dtype=dtype)
                cfg = to_dataclass(SamplerConfig, section["sampler"], f"config.stages.{name}.sampler")
                out.append(Stage(name, sampler_programs(name, mc, make_mesh(MeshConfig(), devices), cfg,
                                                        PROMPT_TOKENS, hbm)))
        return out
    learner = raw.get("learner")
    if learner == "sft":
        return [Stage("sft", sft_stage("sft", raw, devices, hbm))]
    if learner == "rl":
        return [Stage("rl", rl_stage("rl", raw, devices, hbm))]
    if "scoring" in raw and "sources" in raw:
        return [Stage("self_distill", self_distill_stage("self_distill", raw, devices, hbm))]
    if "sampling" in raw and "model" in raw:
        return [Stage("eval", eval_stage("eval", raw, devices, hbm))]
    raise VtError("vt plan: the config is none of SFT, RL (a top-level `learner`), eval (`sampling`), "
                  "self-distill (`scoring`, `sources`) or a recipe (`stages`)")


# --- compile and judge -------------------------------------------------------------------------------------------

def measure(program: Program, hbm: int) -> dict:
    """Compile one program; its row: per-device bytes (and their parts), compile seconds, verdict."""
    row = {"stage": program.stage, "program": program.name, "shape": program.note, "hbm_bytes": hbm}
    t0 = time.perf_counter()
    try:
        compiled = program.build()
    except Exception as e:  # one program failing must not hide the others' numbers
        msg = str(e).strip().splitlines()
        row.update(verdict="FAILED", error=f"{type(e).__name__}: {msg[0][:300] if msg else ''}",
                   compile_s=round(time.perf_counter() - t0, 1))
        oom = _compile_time_oom(msg[0] if msg else "")
        if oom is not None:  # the TPU compiler refuses a program that cannot fit: the verdict, not a failure
            row.update(verdict="DOES NOT FIT", bytes=oom, fix=program.fix)
        return row
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    mem = compiled.memory_analysis()
    parts = dict(argument=mem.argument_size_in_bytes, output=mem.output_size_in_bytes,
                 alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes,
                 code=mem.generated_code_size_in_bytes, resident=program.resident)
    total = (parts["argument"] + parts["output"] - parts["alias"] + parts["temp"] + parts["code"]
             + parts["resident"])
    row.update({f"{k}_bytes": int(v) for k, v in parts.items()}, bytes=int(total),
               kernels=compiled.as_text().count("tpu_custom_call"),
               verdict="fits" if total <= hbm else "DOES NOT FIT")
    if total > hbm:
        row["fix"] = program.fix
    return row


_OOM = re.compile(r"CompileTimeHbmOom.*?required for .*? \(([\d.]+)([KMGT]?)\) exceeds available HBM")


def _compile_time_oom(message: str) -> int | None:
    """The bytes the TPU compiler found a program needs, from its refusal ("E1000: CompileTimeHbmOom: Ran out of
    memory on HBM, the total memory required for HLO temporaries (1.00T) exceeds available HBM (95.73G)"; its
    units are powers of 1024); None for any other error."""
    m = _OOM.search(message)
    if m is None:
        return None
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def table(rows: list[dict]) -> str:
    head = ("stage", "program", "shape", "GB / device", "HBM GB", "compile s", "kernels", "verdict")
    body = [(r["stage"], r["program"], r.get("shape", ""), _gb(r["bytes"]) if "bytes" in r else "-",
             _gb(r["hbm_bytes"]), f"{r['compile_s']:.1f}", str(r.get("kernels", "-")),
             r["verdict"] + (f": {r['error']}" if r["verdict"] == "FAILED" else "")) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)] + [0]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths[:-1]] + ["-" * 7]), *map(fmt, body)])


def plan(raw: dict, topology_name: str, progress: bool = True, json_out: Path | None = None,
         echo: Callable[[str], None] = print) -> int:
    """Compile every program of the config `raw` (a plain dict) for the topology; print the table and, for each
    program that does not fit or does not compile, one line naming it, its bytes and what to change. Returns the
    exit code: 0 everything fits, 1 something does not (or failed to compile). `json_out`: the rows, written as
    they come."""

    topo = tp.parse(topology_name)
    devices = tp.devices(topo)
    hbm = tp.hbm_per_device(topo, len(devices))
    echo(f"vt plan: {topo.name} = {topo.jax_name}: {topo.chips} chips, {len(devices)} devices over "
         f"{_processes(devices)} host(s), {_gb(hbm)} GB HBM a device")
    todo = [p for st in stages(raw, devices, hbm) for p in st.programs]
    rows = []
    for program in todo:
        with tqdm(total=1, desc=f"compiling {program.stage}/{program.name}", disable=not progress,
                  bar_format="{desc}: {elapsed}", leave=True) as bar:
            rows.append(measure(program, hbm))
            bar.update()
        if json_out is not None:
            atomic_write_json(json_out, rows)
    echo(table(rows))
    bad = [r for r in rows if r["verdict"] != "fits"]
    for r in bad:
        if r["verdict"] == "FAILED":
            echo(f"{r['stage']}/{r['program']}: does not compile for {topo.name}: {r['error']}")
        else:
            refused = " (the TPU compiler refused it: out of HBM)" if r.get("error") else ""
            echo(f"{r['stage']}/{r['program']}: {_gb(r['bytes'])} GB a device{refused}, more than the {_gb(hbm)} "
                 f"GB of {topo.name}; {r['fix']}")
    return 1 if bad else 0
