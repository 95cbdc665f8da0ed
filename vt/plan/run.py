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

import copy
import dataclasses
import json
import math
import re
import time
from pathlib import Path
from typing import Callable

import ml_collections
import numpy as np
from tqdm import tqdm

from vt import VtError
from vt.buckets import bucket
from vt.checkpoint.params import load_model_config
from vt.config import apply_override, to_dataclass
from vt.distributed import process_mesh
from vt.io import atomic_write_json
from vt.model.config import ModelConfig, preset
from vt.plan import programs as pg
from vt.plan import topology as tp
from vt.recipe.stages import STAGE_NAMES
from vt.rl.learner import RLConfig
from vt.rl.rollouts import ROW_BUCKET
from vt.sampling.config import SamplerConfig
from vt.sampling.page_table import kv_pool_plan
from vt.sharding import MeshConfig, make_mesh
from vt.train.sft import SftConfig

ONE_DEVICE = {"data": 1, "fsdp": 1, "tensor": 1}  # the default mesh of profile, select, the probe table and eval
DEFAULT_PRESET = "qwen2.5-coder-3b"  # the model of a stage whose checkpoint is set by the pipeline or absent
PROMPT_TOKENS = 2048  # prompt length assumed for sampler-only stages (eval, profile, select): their data decides


@dataclasses.dataclass
class Program:
    stage: str
    name: str  # e.g. "decode"
    build: Callable[[], object]
    fixes: list  # [Fix]: what to change when it does not fit (vt.plan.run.suggest), tried by vt.plan.run.try_fixes
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

@dataclasses.dataclass(frozen=True)
class Fix:
    """One way to make a program smaller: config overrides made together, ((config path, value, why), ...)."""
    changes: tuple

    @property
    def overrides(self) -> list[str]:
        return [f"--config.{k}={v}" for k, v, _ in self.changes]

    def __str__(self) -> str:
        return " ".join(self.overrides) + " (" + "; ".join(why for _, _, why in self.changes) + ")"


def suggest(where: str, *options) -> list[Fix]:
    """The ways to shrink a program, each an option: a change (key, value, why) or a list of changes made together,
    keys under `where`; None (one that does not apply) left out. Which of them fit, and by how much, `try_fixes`
    finds by compiling each."""
    out = []
    for o in filter(None, options):
        out.append(Fix(tuple((f"{where}{k}", v, why) for k, v, why in (o if isinstance(o, list) else [o]))))
    return out


def _more_tensor(mc: ModelConfig, mesh, where: str | None, why: str):
    """Tensor parallelism doubled, where the mesh's devices and the model's KV heads allow it."""
    t = mesh.shape["tensor"] * 2
    if where is None or mesh.devices.size % t or mc.num_kv_heads % t:
        return None
    return (f"{where}tensor", t, f"now {t // 2}: {why}")


def _spread(mesh, devices, where: str | None):
    """A sampler on one device of several (a checkpoint loaded whole onto one chip): its mesh over all of this
    host's devices, the weights and the KV pool sharded (fsdp)."""
    n = len([d for d in devices if d.process_index == devices[0].process_index])
    if where is None or mesh.devices.size > 1 or n == 1:
        return None
    return (f"{where}fsdp", -1, f"now one device of {n}: the weights and the KV pool sharded over all {n}")


def _remat(mc: ModelConfig):
    return None if mc.remat_policy == "full" else ("model.remat_policy", "full", f"now {mc.remat_policy}: recompute "
                                                   "each layer in the backward pass")


LORA = ("model.lora_rank", 64, "train LoRA adapters: no gradients or AdamW moments for the base weights")

def sampler_programs(stage: str, mc: ModelConfig, mesh, cfg: SamplerConfig, prompt: int, hbm: int,
                     resident: int = 0, where: str = "sampling.", mesh_where: str | None = None,
                     devices=None) -> list[Program]:
    """Prefill and decode at `cfg`'s slots, slots as long as `prompt` + max_new_tokens (within the context), the
    KV pool sized as the engine sizes it from the memory left (kv_memory_fraction) beside `resident`. `where`:
    the sampler section's config path, `mesh_where` its mesh's (None: no mesh to change); `devices`: the slice's,
    where the mesh may take more of them."""
    ss = pg.sampler_setup(mc, mesh, cfg)
    context = cfg.max_context or mc.max_position_embeddings
    prompt = min(prompt, context - 1)
    free = max(0, hbm - pg.device_bytes(ss.state) - resident) * mesh.shape["tensor"]  # as free_device_bytes
    # the engine's own sizing of the page table and the pool, for one request as long as the stage allows
    M, _, pool = kv_pool_plan(mc, cfg, [(np.zeros(prompt, np.int32), min(cfg.max_new_tokens, context - prompt), 1)],
                              context, free)
    rows, T = prefill_shape(cfg, prompt, M)
    slots = f"{cfg.batch_size} slots x {M * cfg.page_size} tokens, pool {pool} pages"
    # a pool of kv_pages is the user's size; kv_pages 0 sizes it from the memory the weights leave
    pool_fix = (("kv_pages", 0, f"now {cfg.kv_pages}: the pool sized from the memory left") if cfg.kv_pages else
                ("kv_memory_fraction", round(cfg.kv_memory_fraction * 0.75, 2),
                 f"now {cfg.kv_memory_fraction}: a smaller KV pool, more room for the program's own buffers"))
    pool_fix = (f"{where}{pool_fix[0]}", *pool_fix[1:])
    tensor = _more_tensor(mc, mesh, mesh_where, "splits the weights and the KV pool over more devices")
    spread = _spread(mesh, devices, mesh_where) if devices is not None else None
    return [
        Program(stage, "prefill", pg.prefill(ss, mesh, pool, rows, T), suggest(
                    "", spread, (f"{where}prefill_tokens", max(T, cfg.prefill_tokens // 2),
                                 f"now {cfg.prefill_tokens}: {rows} prompts of {T} a call") if rows > 1 else None,
                    pool_fix, tensor), resident, f"{rows} x {T}, pool {pool} pages"),
        Program(stage, "decode", pg.decode(ss, mesh, pool, M), suggest(
                    "", spread, pool_fix, (f"{where}batch_size", cfg.batch_size // 2,
                                           f"now {cfg.batch_size} decode slots") if cfg.batch_size > 1 else None,
                    tensor), resident, slots),
    ]


def _next_accum(global_rows: int, accum: int, shards: int) -> int | None:
    """The next accumulation that splits the batch into whole micro-batches of whole rows per batch shard."""
    return next((a for a in range(accum + 1, global_rows + 1)
                 if global_rows % a == 0 and (global_rows // a) % shards == 0), None)


def sft_stage(stage: str, section: dict, devices, hbm: int, where: str = "") -> list[Program]:
    cfg = to_dataclass(SftConfig, _only_fields(SftConfig, section), f"config.{stage}")
    mc, _ = model_config(dataclasses.asdict(cfg.model))
    mesh = make_mesh(cfg.mesh, devices)
    d = cfg.data
    rows = d.global_batch_size // d.grad_accum_steps
    ts = pg.train_setup(mc, mesh, cfg.optim)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    accum = _next_accum(d.global_batch_size, d.grad_accum_steps, shards)
    tensor = _more_tensor(mc, mesh, "mesh.", "splits each layer's weights and activations")
    a2 = d.grad_accum_steps * 2  # half the batch shards: twice the accumulation keeps a shard's rows as they are
    if tensor is not None and d.global_batch_size % a2 == 0 and (d.global_batch_size // a2) % max(1, shards // 2) == 0:
        tensor = [tensor, ("data.grad_accum_steps", a2, f"now {d.grad_accum_steps}: {rows // 2} rows a micro-batch "
                           f"over {shards // 2} batch shards, as many a shard as now")]
    half = d.seq_len // 2  # rows half as long, twice as many: the batch's tokens and a shard's tokens as they are
    shorter = [("data.seq_len", half, f"now {d.seq_len}: rows of {half}, a longer example cut or dropped as "
                f"data.overlong says"), ("data.global_batch_size", d.global_batch_size * 2, "as many tokens a batch"),
               ("data.grad_accum_steps", d.grad_accum_steps * 2, "as many tokens a micro-batch")] \
        if half >= 1024 else None
    fix = suggest(where, accum and ("data.grad_accum_steps", accum, f"now {d.grad_accum_steps}: micro-batches of "
                                    f"{rows} rows of {d.seq_len}, {d.global_batch_size // accum} with {accum}"),
                  _remat(mc), tensor, None if mc.lora_rank else LORA, shorter)
    return [Program(stage, "train_step", pg.sft_step(ts, mesh, d.grad_accum_steps, rows, d.seq_len,
                                                     cfg.model.loss_chunk), fix,
                    note=f"{d.grad_accum_steps} x {rows} x {d.seq_len}")]


def rl_stage(stage: str, section: dict, devices, hbm: int, where: str = "") -> list[Program]:
    cfg = to_dataclass(RLConfig, _only_fields(RLConfig, section), f"config.{stage}")
    mc, _ = model_config(dataclasses.asdict(cfg.model))
    n_sampler = cfg.rollout.sampler_devices
    learner_devices = devices[:len(devices) - n_sampler] if n_sampler else devices
    mesh = make_mesh(cfg.mesh, learner_devices)
    sampler_mesh = process_mesh(cfg.mesh, devices[len(devices) - n_sampler:]) if n_sampler else mesh
    s, m = cfg.rollout.sampler, cfg.mgpo
    context = s.max_context or mc.max_position_embeddings
    T = min(bucket(cfg.data.max_prompt_tokens + s.max_new_tokens - 1, ROW_BUCKET, half_octaves=True), context)
    rows = rl_rows(cfg.train.tokens_per_micro_batch, T, mesh, _processes(learner_devices))
    ts = pg.train_setup(mc, mesh, cfg.optim, cfg.train.steps * m.mini_batches)
    moments = pg.device_bytes(ts.abstract.opt_state)
    tokens = cfg.train.tokens_per_micro_batch // 2
    fewer = rl_rows(tokens, T, mesh, _processes(learner_devices)) < rows  # a micro-batch has a row per shard
    tensor = _more_tensor(mc, mesh, "mesh.", "splits each layer's weights and activations")
    new = T // 2 - cfg.data.max_prompt_tokens  # rows half as long: the longest prompt and a response this long
    shorter = ("rollout.sampler.max_new_tokens", new, f"now {s.max_new_tokens}: rows of {T // 2}, responses cut at "
               f"{new} tokens") if new >= 1024 and new < s.max_new_tokens else None
    fix = suggest(where, ("train.tokens_per_micro_batch", tokens, f"now {cfg.train.tokens_per_micro_batch}: "
                                                                   f"{rows} rows of {T}") if fewer else None,
                  _remat(mc), tensor, None if mc.lora_rank else LORA, shorter)
    kw = dict(temperature=s.temperature, loss_chunk=cfg.model.loss_chunk)
    upd = dict(eps_low=m.eps_low, eps_high=m.eps_high, kl_coef=m.kl_coef, is_cap=m.is_cap)
    sampler_mc = mc if not mc.lora_rank else dataclasses.replace(mc, lora_rank=0)
    out = sampler_programs(stage, sampler_mc, sampler_mesh, s, cfg.data.max_prompt_tokens, hbm,
                           resident=0 if n_sampler else moments, where=f"{where}rollout.sampler.",
                           mesh_where=f"{where}mesh.")
    if section.get("profile_k", 0) > 0:  # the recipe profiles the phase's start first (vt.recipe.stages.run_rl):
        # the rollout's sampler at profile_max_new_tokens, on this process's devices in the stage's mesh shape,
        # before the learner holds anything
        profiling = dataclasses.replace(s, max_new_tokens=section.get("profile_max_new_tokens") or s.max_new_tokens)
        out = sampler_programs(f"{stage}.profile", sampler_mc, local_mesh(cfg.mesh, devices), profiling,
                               cfg.data.max_prompt_tokens, hbm, where=f"{where}rollout.sampler.",
                               mesh_where=f"{where}mesh.") + out
    out += [Program(stage, "old_logps", pg.rl_logps(ts, mesh, rows, T, **kw), fix, moments, f"{rows} x {T}"),
            Program(stage, "update", pg.rl_update(ts, mesh, rows, T, **kw, **upd), fix, moments, f"{rows} x {T}"),
            Program(stage, "apply", pg.rl_update(ts, mesh, rows, T, **kw, **upd, part="apply"), suggest(
                where, ("mesh.fsdp", -1, f"now {mesh.shape['fsdp']}: shard the optimiser state over every device")
                if mesh.shape["fsdp"] * mesh.shape["tensor"] < mesh.devices.size else None,
                None if mc.lora_rank else LORA))]
    return out


def profile_programs(stage: str, mc: ModelConfig, devices, section: dict, prompt: int, hbm: int,
                     where: str) -> list[Program]:
    """The sampler of the profile stage, select and the probe table (`section`: theirs, `where` its config path):
    vt.rl.profile and the recipe's verifier load the checkpoint onto the section's `mesh` over this process's
    devices, one device unless it says more (vt.recipe.stages: ProfileStageConfig.mesh)."""
    cfg = to_dataclass(SamplerConfig, section["sampler"], f"config.{where}sampler")
    mesh = to_dataclass(MeshConfig, ONE_DEVICE | dict(section.get("mesh", {})), f"config.{where}mesh")
    return sampler_programs(stage, mc, local_mesh(mesh, devices), cfg, prompt, hbm, where=f"{where}sampler.",
                            mesh_where=f"{where}mesh." if "mesh" in section else None, devices=devices)


def local_mesh(cfg: MeshConfig, devices):
    """vt eval's and self-distill's mesh: process 0's devices in the config's shape (vt.distributed.process_mesh;
    mesh fsdp 1 is one device of the slice)."""
    return process_mesh(cfg, [d for d in devices if d.process_index == devices[0].process_index])


def eval_stage(stage: str, section: dict, devices, hbm: int, fallback: str = DEFAULT_PRESET, where: str = "",
               param_dtype: str | None = None) -> list[Program]:
    """`param_dtype`: the checkpoint's (a recipe's: fp32 master weights); else the compute dtype."""
    model = dict(section.get("model", {}))
    model["preset"] = model.get("preset") or fallback
    mc, _ = model_config(model, param_dtype=param_dtype or model.get("dtype", "bfloat16"))
    mesh = local_mesh(to_dataclass(MeshConfig, ONE_DEVICE | dict(model.get("mesh", {})), f"config.{stage}.model.mesh"),
                      devices)
    cfg = to_dataclass(SamplerConfig, section["sampling"], f"config.{stage}.sampling")
    return sampler_programs(stage, mc, mesh, cfg, PROMPT_TOKENS, hbm, where=f"{where}sampling.",
                            mesh_where=f"{where}model.mesh.", devices=devices)


def self_distill_stage(stage: str, section: dict, devices, hbm: int, fallback: str = DEFAULT_PRESET,
                       where: str = "", param_dtype: str | None = None) -> list[Program]:
    dtype = section.get("dtype", "bfloat16")
    mc, _ = model_config({"init_checkpoint": section.get("student", ""), "preset": fallback},
                         param_dtype=param_dtype or dtype, dtype=dtype)
    mesh = local_mesh(to_dataclass(MeshConfig, section.get("mesh", {}), f"config.{stage}.mesh"), devices)
    cfg = to_dataclass(SamplerConfig, section["sampling"], f"config.{stage}.sampling")
    sc = section.get("scoring", {})
    rows, chunk, lo = sc.get("batch_size", 8), sc.get("chunk_tokens", 0), sc.get("min_bucket", 64)
    length = bucket(PROMPT_TOKENS + cfg.max_new_tokens, lo)
    if chunk:
        length = -(-length // chunk) * chunk
    length = min(length, mc.max_position_embeddings)
    out = sampler_programs(stage, mc, mesh, cfg, PROMPT_TOKENS, hbm, where=f"{where}sampling.",
                           mesh_where=f"{where}mesh.", devices=devices)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    out.append(Program(stage, "scorer", pg.scorer(mc, mesh, rows, length, chunk), suggest(
                           where, ("scoring.batch_size", rows // 2, f"now {rows} rows a forward")
                           if rows // 2 and (rows // 2) % shards == 0 else None,
                           ("scoring.chunk_tokens", max(512, (chunk or length) // 2),
                            f"now {chunk}: positions per KV-cached chunk") if (chunk or length) > 512 else None),
                       note=f"{rows} x {length}" + (f" in chunks of {chunk}" if 0 < chunk < length else "")))
    return out


def sft_sampler_model(raw: dict, fallback: str) -> ModelConfig:
    """The model a sampler-only recipe stage loads: an SFT checkpoint, stored with sft1's dtypes (fp32 master
    weights stay fp32 when load_model restores them)."""
    m = raw["stages"].get("sft1", {}).get("model", {})
    mc, _ = model_config({"preset": fallback}, param_dtype=m.get("param_dtype", "float32"),
                         dtype=m.get("dtype", "bfloat16"), attention_impl=m.get("attention_impl", "auto"))
    return mc


def _only_fields(cls, section: dict) -> dict:
    """A recipe stage section less the pipeline's own fields (enabled, profile_k, ...)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in section.items() if k in names}


def stages(raw: dict, devices, hbm: int, only: str | None = None) -> list[Stage]:
    """The stages a config describes, each with its programs (not yet compiled); `only`: a recipe's stage of that
    name (its section's name: rl_math, eval, probe), the others not built."""
    if "stages" in raw:  # a recipe, its stages in the order they run
        out = []
        # stages whose checkpoints the pipeline sets run the SFT stages' architecture
        fallback = raw["stages"].get("sft1", {}).get("model", {}).get("preset") or DEFAULT_PRESET
        # and their checkpoints keep the training stages' weights dtype (fp32 master weights stay fp32)
        ckpt_dtype = sft_sampler_model(raw, fallback).param_dtype
        for name in sorted(raw["stages"], key=lambda n: STAGE_NAMES.index(n) if n in STAGE_NAMES else len(STAGE_NAMES)):
            section, where = raw["stages"][name], f"stages.{name}."
            if not section.get("enabled", True) or only not in (None, name):
                continue
            if name == "self_distill":
                out.append(Stage(f"{name}.distill", self_distill_stage(f"{name}.distill", section["distill"],
                                                                     devices, hbm, fallback, f"{where}distill.",
                                                                     ckpt_dtype)))
                out.append(Stage(f"{name}.sft", sft_stage(f"{name}.sft", section["sft"], devices, hbm,
                                                          f"{where}sft.")))
            elif "learner" in section:
                out.append(Stage(name, (sft_stage if section["learner"] == "sft" else rl_stage)(
                    name, section, devices, hbm, where)))
            elif "benchmarks" in section:
                for bench, bsec in section["benchmarks"].items():
                    out.append(Stage(f"{name}.{bench}", eval_stage(f"{name}.{bench}", bsec, devices, hbm, fallback,
                                                                   f"{where}benchmarks.{bench}.", ckpt_dtype)))
            elif "sampler" in section:  # profile, select: the SFT checkpoints' sampler
                out.append(Stage(name, profile_programs(name, sft_sampler_model(raw, fallback), devices, section,
                                                        PROMPT_TOKENS, hbm, where)))
        probe = raw.get("probe", {})
        if probe.get("data") and only in (None, "probe"):  # the held-out table after each training stage
            out.append(Stage("probe", profile_programs("probe", sft_sampler_model(raw, fallback), devices, probe,
                                                       PROMPT_TOKENS, hbm, "probe.")))
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

def measure_all(todo: list[Program], hbm: int, progress: bool = False, json_out: Path | None = None,
                earlier: list[dict] = (), compiled: dict | None = None) -> list[dict]:
    """A row per program, each distinct program compiled once: a stage whose program is one an earlier stage
    compiled (the same program_key) gets that program's numbers (a whole recipe costs its distinct programs).
    `earlier`: rows of an earlier run for the same topology, whose programs are not compiled again; `compiled`:
    program_key -> row, shared with later calls (made from `earlier` when not given)."""
    rows = []
    if compiled is None:
        compiled = {}
    for r in sorted(earlier, key=lambda r: "same_as" in r):  # a row reused in its own run holds the numbers too
        if "key" in r and ("bytes" in r or "error" in r):
            compiled.setdefault(r["key"], r)
    for program in todo:
        with tqdm(total=1, desc=f"compiling {program.stage}/{program.name}", disable=not progress,
                  bar_format="{desc}: {elapsed}", leave=True) as bar:
            rows.append(measure(program, hbm, compiled))
            bar.update()
        if json_out is not None:
            atomic_write_json(json_out, rows)
    return rows


def measure(program: Program, hbm: int, compiled: dict | None = None) -> dict:
    """Lower one program and, unless `compiled` (program_key -> the first row of that program) holds it already,
    compile it; its row: per-device bytes (and their parts), compile seconds, verdict, key."""
    row = {"stage": program.stage, "program": program.name, "shape": program.note, "hbm_bytes": hbm}
    t0 = time.perf_counter()
    try:
        lowered = program.build.lower()
        key = pg.program_key(lowered, program.build.mesh)
        row["key"] = key
        first = (compiled or {}).get(key)
        if first is not None:  # the same program as an earlier stage's: its numbers, this stage's resident bytes
            return _same_as(row, first, program, hbm)
        executable = lowered.compile()
    except Exception as e:  # one program failing must not hide the others' numbers
        msg = str(e).strip().splitlines()
        row.update(verdict="FAILED", error=f"{type(e).__name__}: {msg[0][:300] if msg else ''}",
                   compile_s=round(time.perf_counter() - t0, 1))
        oom = _compile_time_oom(msg[0] if msg else "")
        if oom is not None:  # the TPU compiler refuses a program that cannot fit: the verdict, not a failure
            row.update(verdict="DOES NOT FIT", bytes=oom + program.resident, resident_bytes=program.resident)
        if compiled is not None and "key" in row:
            compiled[row["key"]] = row
        return row
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    mem = executable.memory_analysis()
    parts = dict(argument=mem.argument_size_in_bytes, output=mem.output_size_in_bytes,
                 alias=mem.alias_size_in_bytes, temp=mem.temp_size_in_bytes,
                 code=mem.generated_code_size_in_bytes, resident=program.resident)
    row.update({f"{k}_bytes": int(v) for k, v in parts.items()},
               kernels=sum(executable.as_text().count(k) for k in KERNELS))
    _judge(row, program, hbm)
    if compiled is not None:
        compiled[key] = row
    return row


def _judge(row: dict, program: Program, hbm: int) -> None:
    row["bytes"] = (row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
                    + row["code_bytes"] + row["resident_bytes"])
    row["verdict"] = "fits" if row["bytes"] <= hbm else "DOES NOT FIT"


def _same_as(row: dict, first: dict, program: Program, hbm: int) -> dict:
    """`row` (a program compiled already, for an earlier stage) judged from `first`'s numbers: compile_s 0."""
    row.update(same_as=f"{first['stage']}/{first['program']}", compile_s=0.0)
    if "error" in first:
        row.update(verdict=first["verdict"], error=first["error"])
        if "bytes" in first:  # refused for want of HBM: the compiler's bytes plus this stage's resident
            row.update(bytes=first["bytes"] - first["resident_bytes"] + program.resident,
                       resident_bytes=program.resident)
        return row
    row.update({k: first[k] for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "code_bytes",
                                      "kernels")}, resident_bytes=program.resident)
    _judge(row, program, hbm)
    return row


# hand-written kernels in a compiled program: Mosaic (splash, paged attention) on TPU; cuDNN attention and Triton
# (Pallas) on NVIDIA GPUs
KERNELS = ("tpu_custom_call", "__cudnn$fmha", "__gpu$xla.gpu.triton")

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
             _gb(r["hbm_bytes"]), f"= {r['same_as']}" if "same_as" in r else f"{r['compile_s']:.1f}",
             str(r.get("kernels", "-")),
             r["verdict"] + (f": {r['error']}" if r["verdict"] == "FAILED" else "")) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)] + [0]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths[:-1]] + ["-" * 7]), *map(fmt, body)])


def with_overrides(raw: dict, overrides: list[str]) -> dict:
    """`raw` with `--config.KEY=VALUE` overrides applied as the command line applies them (a key the config does
    not have is refused)."""
    cd = ml_collections.ConfigDict(copy.deepcopy(raw))
    for o in overrides:
        apply_override(cd, o)
    return cd.to_dict()


def try_fixes(raw: dict, program: Program, devices, hbm: int, compiled: dict, progress: bool = False) -> list[dict]:
    """Each of `program`'s fixes applied to the config `raw` and the program built and compiled again (not when
    `compiled` holds it: program_key), and where none fits alone, all of them together. One dict per fix tried
    (fix, overrides, bytes, verdict, key): those that fit first, the most bytes saved first."""
    fixes = list(program.fixes)
    out = []
    for n, fix in enumerate(fixes):
        out.append(_try(raw, program, fix, devices, hbm, compiled, progress))
        if n == len(fixes) - 1 and len(fixes) > 1 and not any(t["verdict"] == "fits" for t in out):
            merged = {k: (k, v, why) for f in fixes for k, v, why in f.changes}  # a key changed twice: the last
            fixes.append(Fix(tuple(merged.values())))
    return sorted(out, key=lambda t: (t["verdict"] != "fits", t.get("bytes", math.inf)))


def _try(raw: dict, program: Program, fix: Fix, devices, hbm: int, compiled: dict, progress: bool) -> dict:
    tried = {"fix": str(fix), "overrides": fix.overrides}
    try:
        changed = [p for st in stages(with_overrides(raw, fix.overrides), devices, hbm,
                                      only=program.stage.split(".")[0] if "stages" in raw else None)
                   for p in st.programs if (p.stage, p.name) == (program.stage, program.name)]
    except VtError as e:  # an override this config refuses (a mesh the devices do not divide into, ...)
        return tried | {"verdict": "invalid", "error": str(e)}
    if not changed:
        return tried | {"verdict": "invalid", "error": "the program is gone"}
    with tqdm(total=1, desc=f"trying {program.stage}/{program.name} with {' '.join(fix.overrides)}",
              disable=not progress, bar_format="{desc}: {elapsed}", leave=True) as bar:
        row = measure(changed[0], hbm, compiled)
        bar.update()
    return row | tried


def _fix_text(r: dict) -> str:
    """What a DOES NOT FIT line says to change: the fixes that fit, each with its bytes, the most saved first."""
    tried = r.get("fixes", [])
    if not tried:
        return "; ".join(r.get("untried", [])) + (" (not compiled: --no-try-fixes)" if r.get("untried") else
                                                   "no change to suggest")
    fits = [f"{t['fix']}: {_gb(t['bytes'])} GB" for t in tried if t["verdict"] == "fits"]
    if fits:
        return "fits with (the most bytes saved first): " + "; ".join(fits)
    return "no suggested change fits: " + "; ".join(
        f"{t['fix']}: " + (f"{_gb(t['bytes'])} GB" if "bytes" in t else t.get("error", t["verdict"])) for t in tried)


def plan(raw: dict, topology_name: str, progress: bool = True, json_out: Path | None = None,
         echo: Callable[[str], None] = print, reuse: Path | None = None, fixes: bool = True) -> int:
    """Compile every program of the config `raw` (a plain dict) for the topology; print the table and, for each
    program that does not fit or does not compile, one line naming it, its bytes and what to change: `fixes`, each
    suggested change compiled (try_fixes) and the ones that fit printed, the most bytes saved first; else the
    changes uncompiled. Returns the exit code: 0 everything fits, 1 something does not (or failed to compile).
    `json_out`: the rows, written as they come (the fixes tried too, as rows with `fix_of`). `reuse`: an earlier
    run's JSON rows for this topology; programs found there are not compiled again (a config changed in one stage
    recompiles that stage's programs only)."""

    topo = tp.parse(topology_name)
    devices = tp.devices(topo)
    hbm = tp.hbm_per_device(topo, len(devices))
    echo(f"vt plan: {topo.name} = {topo.jax_name}: {topo.chips} chips, {len(devices)} devices over "
         f"{_processes(devices)} host(s), {_gb(hbm)} GB HBM a device")
    todo = [p for st in stages(raw, devices, hbm) for p in st.programs]
    earlier = []
    if reuse is not None:
        earlier = [r for r in json.loads(reuse.read_text()) if r.get("topology", topo.name) == topo.name]
    compiled = {}
    rows = measure_all(todo, hbm, progress, json_out, earlier, compiled)
    tried = []
    for program, r in zip(todo, rows):
        r["topology"] = topo.name
        if r["verdict"] != "DOES NOT FIT":
            continue
        if fixes:
            r["fixes"] = try_fixes(raw, program, devices, hbm, compiled, progress)
            tried += [dict(t, fix_of=f"{r['stage']}/{r['program']}", topology=topo.name) for t in r["fixes"]
                      if "key" in t]
        else:
            r["untried"] = [str(f) for f in program.fixes]
        r["fix"] = _fix_text(r)
    if json_out is not None and tried:  # the fixes' programs too: --reuse skips them as well
        atomic_write_json(json_out, rows + tried)
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
