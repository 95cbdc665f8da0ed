"""vt's device programs built from abstract inputs: ShapeDtypeStructs carrying their shardings, so that no weight
is ever created and any size compiles on any host, for any mesh (compile-only TPU devices included). Each
builder returns a Build: `lower()` traces and lowers one program, calling it also compiles it and returns the
executable (`memory_analysis()`, `as_text()`); `program_key` tells two stages' programs apart before compiling.

Shared by `vt plan` (vt.plan.run) and bench/compile.py. Everything is traced under `use_mesh(mesh)`, so every
hardware choice reads the mesh's platform (vt.sharding.platform): a TPU topology gets splash attention and the
Pallas paged-attention kernel from a CPU host.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from vt.distill.scoring import SCORING_PAGE, _chunk, _full
from vt.model.kv_pages import PagedKVCache
from vt.model.qwen2 import abstract_model
from vt.sampling import steps
from vt.sampling.config import SamplerConfig
from vt.sampling.engine import _programs
from vt.rl.step import make_rl_step, make_token_logps, row_sharding
from vt.sampling.rules import SamplingParams
from vt.sharding import abstract_of, param_sharding, state_shardings, use_mesh
from vt.train.optim import OptimConfig, make_optimizer
from vt.train.state import ModelDef, abstract_train_state, train_state_shardings
from vt.train.step import train_step_program

@dataclasses.dataclass
class Build:
    """One program: `lower()` traces and lowers it for `mesh`; calling it also compiles (the executable)."""
    lower: Callable[[], object]  # () -> jax.stages.Lowered
    mesh: object

    def __call__(self):
        return self.lower().compile()


_CONSTANT = re.compile(r"dense<[^>]*>")


def program_key(lowered, mesh) -> str:
    """What makes two programs one: the lowered module's text (every op, abstract shape and dtype, sharding
    annotation and mesh axis) with its constants' values blanked, and the devices it runs on. Two stages whose
    programs differ only in constants (a learning rate, a clip epsilon, a temperature, a schedule's length) share
    one compile: a constant's value changes no buffer, so the per-device bytes are the same."""
    text = _CONSTANT.sub("dense<>", lowered.as_text())
    ids = ",".join(str(d.id) for d in mesh.devices.flat)
    return hashlib.sha256(f"{text}\n{mesh.axis_names}{mesh.devices.shape}{ids}".encode()).hexdigest()[:16]


def device_bytes(tree) -> int:
    """Bytes one device holds of the abstract arrays of `tree` (each its shard, by its sharding; whole without
    one)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += int(np.prod(shape)) * np.dtype(x.dtype).itemsize
    return total


@dataclasses.dataclass
class TrainSetup:
    md: ModelDef
    optimizer: object
    schedule: object
    sh: object  # TrainState of NamedShardings
    abstract: object  # TrainState of ShapeDtypeStructs


def train_setup(cfg, mesh, optim: OptimConfig = OptimConfig(lr=1e-5), steps_total: int = 1000) -> TrainSetup:
    """The learner's model, optimiser and abstract train state (params + AdamW moments) in their shardings."""
    with use_mesh(mesh):  # the model's attention is chosen when it is built: for the mesh's platform
        optimizer, schedule = make_optimizer(optim, steps_total)
        md = ModelDef(cfg)
        sh = train_state_shardings(md, optimizer, mesh)
        return TrainSetup(md, optimizer, schedule, sh, abstract_train_state(md, optimizer, sh))


def sft_step(ts: TrainSetup, mesh, accum: int, rows: int, seq: int, loss_chunk: int | None = None) -> Build:
    """vt.train.step.make_train_step: `accum` micro-batches of `rows` rows (all devices) x `seq` tokens."""
    kw = {} if loss_chunk is None else dict(loss_chunk=loss_chunk)

    def lower():
        with use_mesh(mesh):
            program, batch = train_step_program(ts.md, ts.optimizer, ts.schedule, ts.sh, mesh, accum, rows, seq,
                                                **kw)
            return program.lower(ts.abstract, batch)
    return Build(lower, mesh)


def rl_batch(mesh, rows: int, T: int, with_step_keys: bool) -> dict:
    """The RL learner's rows [rows, T] (vt.rl.step.ROW_KEYS), abstract, in its row sharding."""
    keys = ["input_ids", "targets", "positions", "segment_ids"]
    floats = {"loss_mask", "sampler_logp", "old_logp", "adv", "weight"}
    if with_step_keys:
        keys += sorted(floats)  # per token (packed rows)
    sh = row_sharding(mesh)
    return {k: jax.ShapeDtypeStruct((rows, T), np.float32 if k in floats else np.int32, sharding=sh) for k in keys}


def rl_logps(ts: TrainSetup, mesh, rows: int, T: int, temperature: float = 1.0,
             loss_chunk: int | None = None) -> Build:
    """vt.rl.step.make_token_logps: the old-policy (and reference) log-probs of `rows` rows of T tokens."""
    kw = {} if loss_chunk is None else dict(loss_chunk=loss_chunk)

    def lower():
        with use_mesh(mesh):
            logps = make_token_logps(ts.md, ts.sh.params, mesh, temperature=temperature, **kw)
            return logps.lower(ts.abstract.params, rl_batch(mesh, rows, T, False))
    return Build(lower, mesh)


def rl_update(ts: TrainSetup, mesh, rows: int, T: int, temperature: float = 1.0, eps_low: float = 0.2,
              eps_high: float = 0.28, kl_coef: float = 0.0, is_cap: float = 2.0, loss_chunk: int | None = None,
              part: str = "accumulate") -> Build:
    """vt.rl.step.make_rl_step's programs: `part` "accumulate" (one micro-batch's gradients added to the
    accumulator: the memory-heavy program) or "apply" (the optimiser update)."""
    kw = {} if loss_chunk is None else dict(loss_chunk=loss_chunk)

    def lower():
        with use_mesh(mesh):
            step = make_rl_step(ts.md, ts.optimizer, ts.schedule, ts.sh, mesh, temperature=temperature,
                                eps_low=eps_low, eps_high=eps_high, kl_coef=kl_coef, is_cap=is_cap, **kw)
            progs = step.programs
            acc = jax.eval_shape(progs["zeros"].jitted, ts.abstract.params)
            if part == "apply":
                return progs["apply"].lower(ts.abstract, acc)
            return progs["accumulate"].lower(ts.abstract.params, acc, rl_batch(mesh, rows, T, True))
    return Build(lower, mesh)


@dataclasses.dataclass
class SamplerSetup:
    progs: object  # vt.sampling.engine._Programs
    state: object  # abstract nnx.State in its shardings
    mc: object  # ModelConfig
    cfg: SamplerConfig


def abstract_weights(mc, mesh):
    """(graphdef, the weights as an nnx.State of ShapeDtypeStructs in their shardings on `mesh`), the model built
    for the mesh's platform."""
    with use_mesh(mesh):
        graphdef, state = nnx.split(abstract_model(mc))
        shardings = dict(nnx.to_flat_state(state_shardings(state, mesh)))
        return graphdef, nnx.map_state(lambda path, var: var.replace(jax.ShapeDtypeStruct(
            var.get_value().shape, var.get_value().dtype, sharding=shardings[path])), state)


def sampler_setup(mc, mesh, cfg: SamplerConfig) -> SamplerSetup:
    """The sampler's programs (vt.sampling.engine) for `cfg`'s slots and rule, and its abstract weights."""
    graphdef, abstract = abstract_weights(mc, mesh)
    with use_mesh(mesh):
        params = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)
        progs = _programs(graphdef, mc, cfg.batch_size, mesh, params, (), cfg.steps_per_call, cfg.decode_attention)
    return SamplerSetup(progs, abstract, mc, cfg)


def kv_cache(ss: SamplerSetup, mesh, pool_pages: int, table_rows: int, table_pages: int, table_sharding):
    """The KV page pool as the engine allocates it (PagedKVCache.abstract: layout, dtype; PagedKVCache.shardings)
    with a page table [table_rows, table_pages] in `table_sharding`."""
    spec = PagedKVCache.abstract(ss.mc, pool_pages, ss.cfg.page_size, PagedKVCache.table_info(table_rows, table_pages),
                                 decode_kernel=ss.cfg.decode_attention)
    sh = PagedKVCache.shardings(ss.mc, mesh, table_sharding, ss.cfg.decode_attention)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), spec, sh)


def prefill(ss: SamplerSetup, mesh, pool_pages: int, rows: int, prompt_len: int) -> Build:
    """The sampler's prefill (vt.sampling.steps.prefill) of `rows` prompts of `prompt_len` tokens into fresh
    pages, the page table replicated as the engine passes it."""
    rep = NamedSharding(mesh, P())
    row = param_sharding(("batch", None), (rows, 1), mesh, "prefill rows")
    vec = param_sharding(("batch",), (rows,), mesh, "prefill rows")
    tokens = jax.ShapeDtypeStruct((rows, prompt_len), np.int32, sharding=row)
    lens = jax.ShapeDtypeStruct((rows,), np.int32, sharding=vec)

    def lower():
        with use_mesh(mesh):
            cache = kv_cache(ss, mesh, pool_pages, rows, -(-prompt_len // ss.cfg.page_size), rep)
            return ss.progs.prefill.lower(ss.state, cache, tokens, lens)
    return Build(lower, mesh)


def decode(ss: SamplerSetup, mesh, pool_pages: int, table_pages: int) -> Build:
    """The sampler's decode loop (vt.sampling.steps.decode: `steps_per_call` steps of every slot), with slots of
    up to `table_pages` pages each and the page table split over slots, as the engine runs it."""
    B = ss.cfg.batch_size
    row = param_sharding(("batch", None), (B, 1), mesh, "sampler slots (batch_size)")
    scalar = jax.ShapeDtypeStruct((), np.int32)

    def lower():
        with use_mesh(mesh):
            cache = kv_cache(ss, mesh, pool_pages, B, table_pages, row)
            slots = abstract_of(steps.Slots.abstract(B), mesh, "sampler slots (batch_size)")
            return ss.progs.decode.lower(ss.state, cache, slots, scalar, scalar)
    return Build(lower, mesh)


def scorer(mc, mesh, rows: int, length: int, chunk_tokens: int) -> Build:
    """The self-distillation scorer's program (vt.distill.scoring.Scorer) on `rows` traces of `length` tokens: with
    `chunk_tokens` shorter than the traces, one chunk of its KV-cached pass (the pool holds the whole rows); else
    the whole rows in one forward."""
    row = param_sharding(("batch", None), (rows, 1), mesh, "scoring.batch_size")
    graphdef, state = abstract_weights(mc, mesh)
    chunked = 0 < chunk_tokens < length
    C = chunk_tokens if chunked else length
    ints = jax.ShapeDtypeStruct((rows, C), np.int32, sharding=row)
    mask = jax.ShapeDtypeStruct((rows, C), np.float32, sharding=row)

    def lower():
        with use_mesh(mesh):
            if not chunked:
                return jax.jit(functools.partial(_full, graphdef)).lower(state, ints, ints, mask, ints)
            sh = dataclasses.replace(PagedKVCache.shardings(mc, mesh, row), continues=True)
            cache = jax.eval_shape(lambda: PagedKVCache.for_rows(mc, rows, length, SCORING_PAGE))
            cache = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), cache, sh)
            start = jax.ShapeDtypeStruct((), np.int32)
            return jax.jit(functools.partial(_chunk, graphdef), donate_argnums=(1,)).lower(
                state, cache, ints, ints, mask, start)
    return Build(lower, mesh)
