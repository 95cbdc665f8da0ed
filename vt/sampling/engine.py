"""The rollout engine: continuous-batching generation over a Qwen2 model with a paged KV cache.

    engine = Engine(model, SamplerConfig(batch_size=64, max_new_tokens=512, temperature=1.0), mesh=mesh)
    samples = engine.generate([Request(prompt_ids=[...], n=16), ...])   # samples[i][j]: Sample
    engine.update_weights(new_state)                                    # from the learner; no retrace

The host runs a scheduler; the device runs three jitted pure functions (vt.sampling.steps): `prefill`
(prompts padded to a power-of-two length bucket and count, written straight into their pages), `insert`
(start the slots of that prompt's n samples, which share its full pages, and draw their first tokens) and
`decode` (a `lax.while_loop` over up to `steps_per_call` steps that returns early once enough slots are free
to refill, or to hand over to a caller that verifies samples as they finish). Cache and slot state are donated.
Shapes are bucketed (prompt length and prefill count to powers of two, the page table length to the pages of a
power of two or its 1.5x, the insert count fixed at the batch size), so a workload compiles a handful of programs
once and no request recompiles; `engine.compile_count` counts traces.

KV memory: one pool of `page_size`-token pages (vt.sampling.page_table); a sample holds pages for the tokens it
has plus the next decode call's, and returns them when it ends. Before each decode call the running samples
get their pages first; when the pool is short the call runs fewer steps, and when not even one step fits the
youngest sample is preempted (its pages freed, it restarts from its prompt later). Waiting samples are
admitted only into pages left over. Since a sample's tokens depend only on its keys, none of this changes
any result: samples are the same for every page size, pool size and batch size.

Tool calls (SamplerConfig.tools, off by default): a sample whose turn ends `</tool_call>` (a stop token on device
where the vocabulary has one, else found in the text between decode calls) is parked: its slot takes another
sample, it keeps the pages of its decoded prefix, and its call runs on vt.tools' thread pool (the `python` tool in
the warm sandbox pool). Once the tool answers it takes a free slot again: one prefill writes the tool turn's
tokens after its kept prefix (a cache that `continues`: nothing decoded is recomputed) and draws its next token,
until it answers, ends a call past `max_turns` or spends its token budget (policy and tool tokens together). A
parked sample is the first to give its pages back when the pool runs short (it then re-prefills its whole
sequence); a running sample with tool turns that is preempted is resumed that way too, never restarted.

Randomness: sample j of request i draws its t-th token with fold_in(fold_in(fold_in(key(seed), i), j), t),
so results depend only on (seed, request, sample), not on batch size, slot assignment, refill or sharding.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vt import VtError
from vt.buckets import bucket
from vt.model.kv_pages import PagedKVCache
from vt.sampling import steps
from vt.sampling.config import Request, SamplerConfig
from vt.sampling.page_table import (PagePool, PageTables, check_memory, device_memory_bytes, free_device_bytes,
                                   host_memory_bytes, kv_pool_plan, pages_for, prompt_need, prompt_pages)
from vt.sampling.rules import SamplingParams
from vt.sampling.stop import default_stop_ids, find_stop_string
from vt.sharding import param_sharding, shardings_of, state_shardings, use_mesh, zeros_of
from vt.tools.format import CALL_END
from vt.tools.registry import ToolError
from vt.tools.runner import ToolRunner
from vt.validation import FieldError


@dataclasses.dataclass
class Sample:
    completion_ids: list[int]  # generated tokens, the stop token included when one ended the sample
    logprobs: list[float]  # log q(token) under the sampling distribution (0.0 for greedy)
    finish_reason: str  # "stop" (stop token or stop string), "length" or "max_turns" (a tool call past max_turns)
    text: str | None = None  # decoded completion (cut before a stop string) when the engine has a tokenizer
    # [len(completion_ids)] bool: True where the policy sampled the token, False where a tool's turn put it (the
    # learner trains on the policy's tokens only: vt.rl.rollouts.build_rows); None: every token is the policy's
    # With tools (SamplerConfig.tools), completion_ids hold the policy's turns and the tool turns in order, and
    # logprobs are 0.0 on tool tokens.
    policy_mask: np.ndarray | None = None
    tool_calls: int = 0  # calls the sample made (malformed ones included)
    tool_errors: int = 0  # of those, calls answered with an error turn (malformed, unknown tool, bad arguments)
    policy_version: int = 0  # Engine.policy_version (update_weights calls) when the sample began


@dataclasses.dataclass
class Stats:
    decode_steps: int = 0  # batched decode steps (each advances all B slots by one token)
    decode_calls: int = 0  # host round trips into the decode loop
    prefill_calls: int = 0
    prefill_tokens: int = 0  # prompt tokens prefilled (a preempted sample's prompt counts again)
    tokens: int = 0  # completion tokens returned
    pool_pages: int = 0  # KV pool size (pages of page_size tokens)
    peak_pages: int = 0  # most pool pages in use at once
    peak_pages_needed: int = 0  # most pages the live tokens needed at once (shared pages once, no lookahead)
    page_bytes: int = 0  # bytes of one page over all layers, K and V
    preemptions: int = 0  # samples evicted to free pages (restarted later from their prompt)
    parked_evictions: int = 0  # of those, parked samples (tools) that gave their kept pages back (re-prefilled)
    tool_preemptions: int = 0  # of those, running samples after a tool turn (resumed by re-prefilling, not restarted)
    tool_calls: int = 0  # samples parked on a tool call
    resume_tokens: int = 0  # tokens prefilled to resume parked samples (tool turns; whole sequences if evicted)
    tool_wait_seconds: float = 0.0  # time no slot decoded because every sample waited for a tool
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # prefill and insert, to their first tokens on the host
    decode_seconds: float = 0.0  # decode calls, to their outputs on the host
    host_seconds: float = 0.0  # the rest: scheduling, page tables, stop strings, results

    def add(self, other: "Stats") -> None:
        """Accumulate another call's statistics (sizes and peaks as maxima, the rest as sums)."""
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(a, b) if f.name in ("pool_pages", "peak_pages", "peak_pages_needed",
                                                          "page_bytes") else a + b)


def check_prompt(ids, vocab_size: int, max_context: int, where: str) -> np.ndarray:
    """The prompt as int32, or VtError naming `where`: empty, not integers, out of vocab, or too long."""
    try:
        arr = np.asarray(ids, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise VtError(f"{where}: prompt ids must be a list of integers") from None
    if arr.ndim != 1 or (len(ids) and not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                              for t in ids)):
        raise VtError(f"{where}: prompt ids must be a list of integers")
    if arr.size == 0:
        raise VtError(f"{where}: empty prompt")
    bad = arr[(arr < 0) | (arr >= vocab_size)]
    if bad.size:
        raise VtError(f"{where}: token id {int(bad[0])} is out of the vocabulary [0, {vocab_size})")
    if arr.size >= max_context:
        raise VtError(f"{where}: prompt has {arr.size} tokens; the context holds {max_context} "
                      "(prompt + at least one new token)")
    return arr.astype(np.int32)


class _Programs:
    """The jitted device functions of one (model structure, batch size, mesh, sampling rule, steps per call,
    decode kernel)."""

    def __init__(self, graphdef, mc, B: int, mesh: Mesh | None, params: SamplingParams, stop_ids: tuple[int, ...],
                 steps_per_call: int, decode_kernel: str):
        self.traces = 0
        out = lambda s: {}  # noqa: E731
        if mesh is not None:
            # Page tables (while decoding) and slot state are split over slots, as the decode batch is.
            row = param_sharding(("batch", None), (B, 1), mesh, "sampler slots (batch_size)")
            rep = NamedSharding(mesh, PartitionSpec())
            slots_sh = shardings_of(steps.Slots.abstract(B), mesh, "sampler slots (batch_size)")
            cache_sh = lambda table: PagedKVCache.shardings(mc, mesh, table, decode_kernel)  # noqa: E731
            out = lambda s: dict(out_shardings=s)  # noqa: E731
        rule = dict(params=params, stop_ids=stop_ids)
        self.prefill = jax.jit(self._counted(functools.partial(steps.prefill, graphdef)), donate_argnums=1,
                               **out(mesh and (rep, cache_sh(rep))))
        # the same prefill over a cache that `continues` (a static field, so its own shardings): resumed samples
        self.resume = jax.jit(self._counted(functools.partial(steps.prefill, graphdef)), donate_argnums=1,
                              **out(mesh and (rep, dataclasses.replace(cache_sh(rep), continues=True))))
        self.insert = jax.jit(self._counted(functools.partial(steps.insert, **rule)), donate_argnums=(0, 1),
                              **out(mesh and (cache_sh(rep), slots_sh, rep, rep)))
        self.decode = jax.jit(self._counted(functools.partial(steps.decode, graphdef, steps_per_call=steps_per_call,
                                                              **rule)), donate_argnums=(1, 2),
                              **out(mesh and (cache_sh(row), slots_sh, rep, rep, rep)))
        self.deactivate = jax.jit(self._counted(steps.deactivate), donate_argnums=0, **out(mesh and slots_sh))
        self.take = jax.jit(self._counted(lambda s, rows: jax.tree.map(lambda x: x[rows], s)),
                            **out(mesh and slots_sh))
        self.zeros = jax.jit(self._counted(lambda n_pages, page_size: zeros_of((
            PagedKVCache.abstract(mc, n_pages, page_size, PagedKVCache.table_info(1, 1), decode_kernel=decode_kernel),
            steps.Slots.abstract(B)))),
            static_argnums=(0, 1), **out(mesh and (cache_sh(rep), slots_sh)))

    def _counted(self, fn):
        def traced(*args, **kwargs):
            self.traces += 1  # runs only while jax traces: once per new shape/sharding signature
            return fn(*args, **kwargs)
        return traced


_programs = functools.lru_cache(maxsize=32)(_Programs)


class Engine:
    def __init__(self, model, cfg: SamplerConfig = SamplerConfig(), mesh: Mesh | None = None, tokenizer=None):
        graphdef, state = model if isinstance(model, tuple) else nnx.split(model)
        self.model_cfg = mc = nnx.merge(graphdef, state).cfg
        self.cfg, self.mesh, self.tokenizer = cfg, mesh, tokenizer
        if cfg.stop_strings and tokenizer is None:
            raise VtError("sampler config: field 'stop_strings' needs a tokenizer")
        self.max_context = cfg.max_context or mc.max_position_embeddings
        self.stop_ids = (tuple(cfg.stop_token_ids) if cfg.stop_token_ids is not None
                         else default_stop_ids(mc.vocab_size, tokenizer, mc.eos_token_id))
        self.policy_version = 0  # update_weights calls; each sample records the version it began with
        self.tools, self.call_end_id = None, None
        if cfg.tools is not None:
            if tokenizer is None:
                raise VtError("sampler config: field 'tools' needs a tokenizer")
            try:
                self.tools = ToolRunner(cfg.tools, tokenizer)
            except ToolError as e:
                raise FieldError("ToolsConfig", "tools", str(e)) from None
            end = tokenizer.encode(CALL_END)
            if len(end) == 1:  # a token of its own (Qwen's vocabularies): the device stops on it; else the host
                self.call_end_id = end[0]  # finds the text between decode calls, as stop strings
                self.stop_ids = tuple(sorted({*self.stop_ids, end[0]}))
        self.params = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)
        self.stats, self.last_stats = Stats(), Stats()
        self._calls = 0
        self._param_sh = None if mesh is None else state_shardings(state, mesh)
        self.graphdef, self.state = graphdef, self._place(state)
        if cfg.decode_attention == "pallas" and mesh is not None and any(
                PagedKVCache.shardings(mc, mesh, None).k.spec):
            raise FieldError(type(cfg).__name__, "decode_attention", "'pallas' reads each KV head's pages whole on "
                             "one device, but this mesh splits the KV heads (tensor > 1): use 'xla' or 'auto'")
        self._p = _programs(graphdef, mc, cfg.batch_size, mesh, self.params, self.stop_ids, cfg.steps_per_call,
                            cfg.decode_attention)

    @property
    def compile_count(self) -> int:
        """Traces of this engine's programs (shared by engines with the same model, batch size, mesh and
        sampling rule, which reuse each other's compilations)."""
        return self._p.traces

    def close(self) -> None:
        """End the tool runner's threads (vt.tools.runner.ToolRunner.close); no more generate calls after it."""
        if self.tools is not None:
            self.tools.close()

    def _place(self, state):
        return state if self._param_sh is None else jax.device_put(state, self._param_sh)

    def _ctx(self):
        return use_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def update_weights(self, state) -> None:
        """Take new weights (an nnx.State of the same model). Same shapes and dtypes are required; arrays are
        moved device-to-device into the engine's shardings (a no-op when they already match), so nothing
        retraces and nothing goes through the host."""
        spec = lambda t: jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), t)  # noqa: E731
        if jax.tree.structure(state) != jax.tree.structure(self.state) or spec(state) != spec(self.state):
            raise VtError("update_weights: the new state's structure, shapes or dtypes differ from the engine's")
        self.state = self._place(state)
        self.policy_version += 1

    def check(self, requests: Sequence[Request]) -> list[tuple[np.ndarray, int, int]]:
        """Validate requests -> (prompt, max_new_tokens, n) each; max_new is cut to fit the context."""
        out = []
        for i, r in enumerate(requests):
            ids = check_prompt(r.prompt_ids, self.model_cfg.vocab_size, self.max_context, f"request {i}")
            mn = self.cfg.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
            n = self.cfg.n if r.n is None else r.n
            if mn < 1 or n < 1:
                raise VtError(f"request {i}: max_new_tokens and n must be >= 1, got {mn} and {n}")
            out.append((ids, min(mn, self.max_context - len(ids)), n))
        return out

    def generate(self, requests: Sequence[Request], seed: int | None = None,
                 progress: Callable[[int], None] | None = None, first_request: int = 0,
                 on_finished: Callable[[int, int, Sample], None] | None = None) -> list[list[Sample]]:
        """Samples for every request, in request order: result[i][j] is sample j of request i.
        seed None: the config's seed plus the number of earlier generate calls (fresh samples each RL step).
        progress(k) is called with the number of samples finished since the last call.
        on_finished(i, j, sample) is called once per sample, with result[i][j], as soon as its slot ends (stop
        token, stop string or length), while the other slots go on decoding: an RL step verifies it meanwhile
        (vt.rewards.streaming). It runs on the scheduler's thread between decode calls, so it should only hand
        the sample on; an exception in it ends the call.
        first_request: the index of requests[0] in a larger batch split over processes; sample j of request i
        draws as request first_request + i would, so a split batch samples what the whole one would."""
        reqs = self.check(requests)
        check_memory(self.model_cfg, self.cfg, reqs, self.max_context, device_bytes=device_memory_bytes(self.mesh),
                     host_bytes=host_memory_bytes(), free_bytes=free_device_bytes(self.mesh))
        if seed is None:
            seed, self._calls = self.cfg.seed + self._calls, self._calls + 1
        t0, self.last_stats = time.perf_counter(), Stats()
        results: list[list[Sample | None]] = [[None] * n for _, _, n in reqs]
        if not reqs:
            return []
        run = _Run(self.cfg, self._p, self.state, self.mesh, self.tokenizer, self.max_context, self.model_cfg,
                   self.last_stats, reqs, jax.random.PRNGKey(seed), first_request)
        run.tools, run.call_end_id, run.policy_version = self.tools, self.call_end_id, self.policy_version
        with self._ctx():
            run.loop(results, progress, on_finished)
        st = self.last_stats
        st.seconds = time.perf_counter() - t0
        st.host_seconds = st.seconds - st.prefill_seconds - st.decode_seconds
        self.stats.add(st)
        return results


@dataclasses.dataclass
class _Slot:
    """What the host keeps of the sample a decode slot runs (the device's half is steps.Slots)."""
    request: int
    sample: int
    born: int  # admission serial: the youngest sample is preempted first
    toks: list[int]  # generated so far (with tools: the policy's and the tool turns' tokens, in order)
    lps: list[float]  # their log-probs (0.0 on tool tokens)
    seen: int = 0  # len(toks) at the last stop-string check
    tool_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # [start, end) of each tool turn
    turn_start: int = 0  # where the policy's current turn begins in toks (after the last tool turn)
    call_seen: int = 0  # len(toks) at the last check for a tool call's end (host-side detection)
    calls: int = 0
    errors: int = 0
    version: int = 0  # the engine's policy_version when the sample began


@dataclasses.dataclass
class _Parked:
    """A sample out of its slot: waiting for its tool call (`future`: (tool turn ids, call ran) or, for a sample
    preempted after a tool turn, ([], None)), holding the pages of its first `kept` positions."""
    slot: _Slot
    pages: list[int]
    kept: int
    future: cf.Future


class _Run:
    """The scheduler of one `generate` call: the queue, the slots, their pages, the device state, its statistics
    (`stats`, filled in as it goes) and the samples it returns."""

    def __init__(self, cfg: SamplerConfig, programs: _Programs, state, mesh: Mesh | None, tokenizer,
                 max_context: int, model_cfg, stats: Stats, reqs, base_key, first_request: int):
        self.cfg, self.programs, self.state, self.tokenizer, self.stats = cfg, programs, state, tokenizer, stats
        self.reqs, self.base_key, self.first_request = reqs, base_key, first_request
        self.B, self.Z, self.I = cfg.batch_size, cfg.page_size, cfg.steps_per_call
        # Page table width M: pages of the longest sample's length bucket.
        self.M, page_bytes, n_pages = kv_pool_plan(model_cfg, cfg, reqs, max_context, free_device_bytes(mesh))
        for i, (p, mn, _) in enumerate(reqs):
            if pages_for(len(p) + mn, self.Z) > n_pages:
                raise VtError(f"request {i}: {len(p)} + {mn} tokens need {pages_for(len(p) + mn, self.Z)} KV pages of "
                              f"{self.Z} tokens; the pool holds {n_pages} (sampler config kv_pages / "
                              "kv_memory_fraction)")
        self.pool = PagePool(n_pages)
        self.tables = PageTables(self.pool, self.B, self.M, self.Z)
        stats.pool_pages, stats.page_bytes = n_pages, page_bytes
        self.queue = collections.deque((i, j) for i, (_, _, n) in enumerate(reqs) for j in range(n))
        self.live: list[_Slot | None] = [None] * self.B  # per decode slot: its sample, None when free
        self.parked: list[_Parked] = []  # samples out of their slots during a tool call (with tools only)
        self.tools, self.call_end_id, self.policy_version = None, None, 0  # set by Engine.generate
        self.serial = 0
        # the decode batch never shrinks below a multiple of the mesh's batch axes (its slots are split there)
        self.min_batch = 1 if mesh is None else int(np.prod([mesh.shape[a] for a in ("data", "fsdp")
                                                             if a in mesh.shape]))
        self.cache, self.slots = programs.zeros(n_pages, self.Z)

    def _busy(self) -> list[int]:
        return [b for b in range(self.B) if self.live[b] is not None]

    def _limit(self, b: int, steps: int) -> int:
        """Tokens slot b's pages must hold to run `steps` more steps (its K/V positions end at L + max_new - 2)."""
        prompt, mn, _ = self.reqs[self.live[b].request]
        L = len(prompt)
        return min(L + len(self.live[b].toks) - 1 + steps, L + mn - 1)

    def _preempt(self, b: int) -> None:
        s = self.live[b]
        if s.calls:  # after a tool turn: resumed later from its tokens (re-prefilled), not restarted and re-called
            done = cf.Future()
            done.set_result(([], None))
            self.parked.append(_Parked(s, [], 0, done))
            self.stats.tool_preemptions += 1
        else:
            self.queue.appendleft((s.request, s.sample))  # older preempted samples end up in front: order kept
        self.tables.free(b)
        self.live[b] = None
        self.stats.preemptions += 1

    def _pages_for_next_call(self) -> int:
        """Give every running slot pages for the next call and return its step count: the full steps_per_call
        when the pool allows, else fewer; when not even one step fits, preempt the youngest sample."""
        while True:
            running = self._busy()
            if not running:
                return self.I
            for n_steps in (self.I, *[s for s in (self.Z, 1) if s < self.I]):
                if sum(self.tables.missing(b, self._limit(b, n_steps)) for b in running) <= self.pool.free:
                    for b in running:
                        self.tables.grow(b, self._limit(b, n_steps))
                    return n_steps
            if not self._evict_parked():  # a parked sample re-prefills: cheaper than a restart that re-decodes
                self._preempt(max(running, key=lambda b: self.live[b].born))

    def _take_units(self, free: list[int], steps: int) -> list[tuple[int, int]]:
        """Queued samples to admit now, in queue order, as many as free slots and pages allow (the rest wait).
        Each needs its prompt's pages (shared with the other samples of its prompt admitted with it, plus a
        copy of a partly filled last page) and pages for the next call's steps."""
        units, budget, seen = [], self.pool.free, set()
        while self.queue and len(units) < len(free):
            i, j = self.queue[0]
            p, mn, _ = self.reqs[i]
            L = len(p)
            extra = pages_for(min(L + steps, L + mn - 1), self.Z) - pages_for(L, self.Z)
            cost = max(0, extra) + (prompt_need(L, 2, self.Z) - pages_for(L, self.Z) if i in seen
                                    else pages_for(L, self.Z))
            if cost > budget:
                break
            budget -= cost
            seen.add(i)
            units.append(self.queue.popleft())
        return units

    def loop(self, results, progress, on_finished) -> None:
        cfg, st = self.cfg, self.stats
        handed_over = False  # the last decode call ended early only to hand finished samples over
        while self.queue or self._busy() or self.parked:
            # A call cut short only to hand samples over leaves the batch as it is: a smaller batch is a program
            # to compile, which a short run (one decode call per batch without a hook, as the demo's) would pay.
            if not handed_over:
                self._shrink()
            B = self.B
            min_free = cfg.refill_min_free or max(1, B // 8)
            steps = self._pages_for_next_call()
            free = [b for b in range(B) if self.live[b] is None]
            if self.parked and free:  # samples back from their tool calls go first: they hold pages already
                free = self._resume_ready(free, steps, results, on_finished, progress)
            # An answered sample that found a free slot but no pages: new samples wait (they would take the pages)
            starved = bool(free) and any(p.future.done() for p in self.parked)
            if self.queue and free and not starved and (cfg.refill or len(free) == B):
                units = self._take_units(free, steps)
                if not units and len(free) == B and not self.parked:
                    raise VtError("sampler: internal error: the KV pool cannot hold a single waiting sample")
                if not units and not self._busy():
                    self._evict_parked()  # parked samples' pages block every admission: they re-prefill later
                    continue
                if units:
                    self._admit(units, free[:len(units)], steps)
            if not self._busy():  # every sample waits for a tool (or nothing is left)
                if starved:
                    self._evict_parked()  # answered, but the parked samples' pages leave none to resume it in
                elif self.parked:
                    t = time.perf_counter()
                    cf.wait([p.future for p in self.parked], return_when=cf.FIRST_COMPLETED)
                    st.tool_wait_seconds += time.perf_counter() - t
                continue
            idle = B - len(self._busy())  # > 0 with a queue: admission waits for pages
            # Run until enough slots are free to be worth a refill; when samples wait for pages, until one more
            # sample ends (its pages come back), so each call makes progress. With nothing to refill, until every
            # slot is done, or, when on_finished waits for samples (verification beside decoding), until
            # min_free more are: they are handed over a few at a time, not all at the end of the batch.
            # Parked samples count as waiting: a slot that frees can take one back once its tool answered.
            handover = False
            waiting = len(self.queue) + len(self.parked)
            if waiting and cfg.refill:
                want = idle + max(1, min(waiting, min_free))
            elif on_finished is not None:
                want, handover = idle + min_free, True
            else:
                want = B
            t = time.perf_counter()
            cache = dataclasses.replace(self.cache, page_table=jnp.asarray(self.tables.table))
            self.cache, self.slots, n_steps, tok_IB, lp_IB = self.programs.decode(
                self.state, cache, self.slots, jnp.int32(steps), jnp.int32(want))
            active, stopped, n_steps, tok_IB, lp_IB = jax.device_get(
                (self.slots.active, self.slots.stopped, n_steps, tok_IB, lp_IB))
            st.decode_seconds += time.perf_counter() - t
            st.decode_steps += int(n_steps)
            st.decode_calls += 1
            handed_over = handover and int(n_steps) < steps
            owned = self._busy()
            for b in owned:
                got = tok_IB[:n_steps, b] >= 0
                self.live[b].toks += tok_IB[:n_steps, b][got].tolist()
                self.live[b].lps += lp_IB[:n_steps, b][got].tolist()
            self._note_live(owned)
            done = [b for b in owned if not active[b]]
            cut = self._stop_strings(owned) if cfg.stop_strings else {}
            calls = self._call_ends(owned, stopped, active) if self.tools is not None else {}
            for b, m in list(calls.items()):  # a tool call ends before any stop string: the sample parks there
                if b in cut and cut[b][0] <= m:
                    del calls[b]
                else:
                    cut.pop(b, None)
            newly = [b for b in [*cut, *calls] if active[b]]
            if newly:
                self.slots = self.programs.deactivate(self.slots, jnp.asarray(np.isin(np.arange(B), newly)))
                done += newly
            finished = 0
            for b in done:
                reason = None
                if b in calls:
                    if self._park(b, calls[b]):
                        continue
                    reason = "max_turns"
                finished += 1
                s = self.live[b]
                results[s.request][s.sample] = sample = self._result(s, bool(stopped[b]), cut.get(b), reason)
                st.tokens += len(sample.completion_ids)
                self.tables.free(b)
                self.live[b] = None
                if on_finished is not None:
                    on_finished(s.request, s.sample, sample)
            if finished and progress is not None:
                progress(finished)
        st.peak_pages = self.pool.peak_in_use
        st.peak_pages_needed = self.tables.peak_needed

    # ---- tool calls (SamplerConfig.tools) ---------------------------------------------------------------------

    def _call_ends(self, owned, stopped, active) -> dict[int, int]:
        """slot -> tokens to keep, for samples whose current turn ends a tool call: on the device's stop at the
        `</tool_call>` token, or (a vocabulary without that token) the text's first `</tool_call>` in the turn."""
        ends = {}
        for b in owned:
            s = self.live[b]
            if self.call_end_id is not None:
                if stopped[b] and not active[b] and s.toks[-1] == self.call_end_id:
                    ends[b] = len(s.toks)
            elif len(s.toks) > s.call_seen:
                s.call_seen = len(s.toks)
                hit = find_stop_string(s.toks[s.turn_start:], self._text, (CALL_END,))
                if hit:
                    ends[b] = s.turn_start + hit[0]
        return ends

    def _park(self, b: int, m: int) -> bool:
        """Slot b's sample ended a tool call at token m: cut it there, and unless it has made max_turns calls
        already (False: it ends), move it out of its slot, keeping the pages of its decoded prefix, and start the
        call in the background."""
        s = self.live[b]
        del s.toks[m:], s.lps[m:]  # tool turns all end before the current turn: its spans stay
        s.seen, s.call_seen = min(s.seen, m), m
        if s.calls >= self.tools.cfg.max_turns:
            return False
        s.calls += 1
        self.stats.tool_calls += 1
        # Positions before the last token hold their keys and values (the last one's are written when it is fed).
        kept = len(self.reqs[s.request][0]) + len(s.toks) - 1
        self.parked.append(_Parked(s, self.tables.detach(b, kept), kept, self.tools.submit(s.toks[s.turn_start:])))
        self.live[b] = None
        return True

    def _evict_parked(self) -> bool:
        """Release the pages of one parked sample (it re-prefills its whole sequence when resumed), those still
        waiting for their tool first, the most pages first. False when no parked sample holds pages."""
        held = [p for p in self.parked if p.pages]
        if not held:
            return False
        p = min(held, key=lambda p: (p.future.done(), -len(p.pages)))
        self.pool.release(p.pages)
        p.pages, p.kept = [], 0
        self.stats.preemptions += 1
        self.stats.parked_evictions += 1
        return True

    def _resume_ready(self, free: list[int], steps: int, results, on_finished, progress) -> list[int]:
        """Put samples whose tool answered back into free slots, with the tool turn appended: one prefill that
        continues each sample's kept pages (its decoded prefix is not recomputed) and draws its next token.
        Returns the slots still free."""
        cfg, st = self.cfg, self.stats
        t = time.perf_counter()
        rows = lambda n: min(bucket(n, cfg.min_prefill_rows), bucket(self.B))  # noqa: E731
        units, longest, budget = [], 0, self.pool.free
        for p in [p for p in self.parked if p.future.done()]:
            s = p.slot
            prompt, mn, _ = self.reqs[s.request]
            ids, ran = p.future.result()
            if ids:
                if not ran:
                    s.errors += 1
                room = mn - len(s.toks)
                if len(ids) >= room:  # no room left for a policy token: it ends with what fits of the tool turn
                    s.toks += ids[:room]
                    s.lps += [0.0] * min(len(ids), room)
                    s.tool_spans.append((len(s.toks) - min(len(ids), room), len(s.toks)))
                    self.parked.remove(p)
                    self.pool.release(p.pages)
                    results[s.request][s.sample] = sample = self._result(s, False, None)
                    st.tokens += len(sample.completion_ids)
                    if on_finished is not None:
                        on_finished(s.request, s.sample, sample)
                    if progress is not None:
                        progress(1)
                    continue
                s.toks += ids
                s.lps += [0.0] * len(ids)
                s.tool_spans.append((len(s.toks) - len(ids), len(s.toks)))
                s.turn_start = s.call_seen = len(s.toks)
                p.future = cf.Future()
                p.future.set_result(([], None))  # appended: a later try (no pages yet) must not append it again
            L = len(prompt)
            chunk = L + len(s.toks) - p.kept
            need = pages_for(min(L + len(s.toks) + steps, L + mn - 1), self.Z) - len(p.pages)
            if (len(units) == len(free) or need > budget
                    or (units and rows(len(units) + 1) * bucket(max(longest, chunk), cfg.min_prompt_bucket)
                        > cfg.prefill_tokens)):
                continue
            budget -= max(0, need)
            longest = max(longest, chunk)
            units.append(p)
        if units:
            self._prefill_resumed(units, free[:len(units)], steps, rows(len(units)), longest)
            st.prefill_seconds += time.perf_counter() - t
        return free[len(units):]

    def _prefill_resumed(self, units: list[_Parked], slots_for: list[int], n_steps: int, A: int, longest: int) -> None:
        T = min(bucket(longest, self.cfg.min_prompt_bucket), self.M * self.Z)
        toks = np.zeros((A, T), np.int32)
        lens, start = np.ones(A, np.int32), np.zeros(A, np.int32)
        table = np.full((A, self.M), self.pool.num_pages, np.int32)
        for a, (p, b) in enumerate(zip(units, slots_for)):
            s = p.slot
            self.parked.remove(p)
            seq = [*self.reqs[s.request][0], *s.toks]
            toks[a, :len(seq) - p.kept], lens[a], start[a] = seq[p.kept:], len(seq) - p.kept, p.kept
            self.live[b] = s
            self.tables.assign(b, p.pages)
            # pages for the chunk, the token drawn after it and the next call's steps (as _limit, one token on)
            self.tables.grow(b, min(len(seq) + n_steps, len(self.reqs[s.request][0]) + self.reqs[s.request][1] - 1))
            table[a] = self.tables.table[b]
            self.stats.resume_tokens += len(seq) - p.kept
        cache = dataclasses.replace(self.cache, page_table=jnp.asarray(table), continues=True)
        logits, cache = self.programs.resume(self.state, cache, jnp.asarray(toks), jnp.asarray(lens),
                                             jnp.asarray(start))
        slots = [p.slot for p in units]
        adm = self._admission([(q, b, s.request, s.sample, len(s.toks))
                               for q, (s, b) in enumerate(zip(slots, slots_for))])
        self.cache, self.slots, tok_Q, lp_Q = self.programs.insert(
            dataclasses.replace(cache, continues=False), self.slots, logits, adm, self.base_key)
        tok_Q, lp_Q = jax.device_get((tok_Q, lp_Q))
        for q, (s, b) in enumerate(zip(slots, slots_for)):
            s.toks.append(int(tok_Q[q]))
            s.lps.append(float(lp_Q[q]))
            s.born = self.serial
            self.serial += 1
        self.stats.prefill_calls += 1

    def _text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_strings(self, owned) -> dict[int, tuple[int, str]]:
        """slot -> (tokens to keep, text before the stop string) for samples whose text holds a stop string. With
        tools, only the policy's current turn is searched: a tool's output never stops a sample (its earlier turns
        were searched as they were written)."""
        cut = {}
        for b in owned:
            s = self.live[b]
            if len(s.toks) > s.seen:
                s.seen = len(s.toks)
                hit = find_stop_string(s.toks[s.turn_start:], self._text, self.cfg.stop_strings)
                if hit and s.turn_start:
                    hit = (s.turn_start + hit[0], self._text(s.toks[:s.turn_start]) + hit[1])
                if hit:
                    cut[b] = hit
        return cut

    def _result(self, s: _Slot, stopped: bool, cut: tuple[int, str] | None, reason: str | None = None) -> Sample:
        m, text = cut if cut is not None else (len(s.toks), None)
        if cut is None and self.tokenizer is not None:
            text = self._text(s.toks)
        reason = reason or ("stop" if stopped or cut is not None else "length")
        mask = None
        if s.tool_spans:
            mask = np.ones(m, bool)
            for a, z in s.tool_spans:
                mask[a:z] = False
        return Sample(s.toks[:m], s.lps[:m], reason, text, policy_mask=mask, tool_calls=s.calls, tool_errors=s.errors,
                      policy_version=s.version)

    def _note_live(self, owned) -> None:
        """Track the pages the live tokens need (each shared page once), to compare with the pages in use."""
        if not owned:
            return
        held = [self.tables.table[b, :pages_for(len(self.reqs[self.live[b].request][0]) + len(self.live[b].toks) - 1,
                                                self.Z)] for b in owned]
        self.tables.note_live(len(np.unique(np.concatenate(held))))

    def _shrink(self) -> None:
        """Once nothing waits and at most half the slots are busy, move the busy ones into a batch of the next
        power of two: a long tail then decodes at the batch it has, not at the batch it started with. The
        pages stay where they are (only page-table rows move), and since keys follow samples, not slots,
        nothing else changes."""
        if self.queue or self.parked:  # parked samples come back to slots of this batch
            return
        busy = self._busy()
        target = max(bucket(len(busy)), self.min_batch)
        if target >= self.B or self.B % target:
            return
        rows = busy + [b for b in range(self.B) if self.live[b] is None][:target - len(busy)]
        self.slots = self.programs.take(self.slots, jnp.asarray(rows, jnp.int32))
        self.tables.take(rows)
        self.live = [self.live[b] for b in rows]
        self.B = target

    def _admit(self, units, slots_for, steps: int) -> None:
        """Prefill the distinct prompts of `units` (in groups of at most `prefill_tokens` padded tokens) into
        fresh pages, start each unit in its slot (sharing its prompt's full pages) and give it pages for the
        next call."""
        cfg, B, reqs, st = self.cfg, self.B, self.reqs, self.stats
        t = time.perf_counter()
        by_req = collections.defaultdict(list)
        for u, b in zip(units, slots_for):
            by_req[u[0]].append((u[1], b))
        rows = lambda n: min(bucket(n, cfg.min_prefill_rows), bucket(B))  # noqa: E731
        groups, group, longest = [], [], 0
        for i in by_req:
            longest = max(longest, len(reqs[i][0]))
            if group and rows(len(group) + 1) * bucket(longest, cfg.min_prompt_bucket) > cfg.prefill_tokens:
                groups.append(group)
                group, longest = [], len(reqs[i][0])
            group.append(i)
        groups.append(group)
        S = self.M * self.Z
        unowned = self.pool.num_pages
        for group in groups:
            A = rows(len(group))
            T = min(bucket(max(len(reqs[i][0]) for i in group), cfg.min_prompt_bucket), S)
            toks = np.zeros((A, T), np.int32)
            lens = np.ones(A, np.int32)
            table = np.full((A, pages_for(T, self.Z)), unowned, np.int32)
            starts, copies = {}, []
            for p, i in enumerate(group):
                length = len(reqs[i][0])
                toks[p, :length], lens[p] = reqs[i][0], length
                own, per_sample, cp = prompt_pages(self.pool, length, len(by_req[i]), self.Z)
                table[p, :len(own)] = own
                starts[i] = per_sample
                copies += cp
                st.prefill_tokens += length
            cache = dataclasses.replace(self.cache, page_table=jnp.asarray(table))
            logits, self.cache = self.programs.prefill(self.state, cache, jnp.asarray(toks), jnp.asarray(lens))
            placed = [(p, i, j, b, k) for p, i in enumerate(group) for k, (j, b) in enumerate(by_req[i])]
            self.cache, self.slots, tok_Q, lp_Q = self.programs.insert(
                self.cache, self.slots, logits, self._admission([(p, b, i, j, 0) for p, i, j, b, _ in placed], copies),
                self.base_key)
            tok_Q, lp_Q = jax.device_get((tok_Q, lp_Q))
            for q, (p, i, j, b, k) in enumerate(placed):
                self.live[b] = _Slot(request=i, sample=j, born=self.serial, toks=[int(tok_Q[q])], lps=[float(lp_Q[q])],
                                     version=self.policy_version)
                self.serial += 1
                self.tables.assign(b, starts[i][k])
                self.tables.grow(b, self._limit(b, steps))
            st.prefill_calls += 1
        st.prefill_seconds += time.perf_counter() - t

    def _admission(self, rows, copies=()) -> steps.Admission:
        """The insert call's record of samples starting in slots, (prefill row, slot, request, sample, tokens its
        completion holds already) each, and the page `copies`, padded to B rows: one insert program per prefill
        shape; padding rows are dropped. A sample starts at position len(prompt) + those tokens."""
        def padded(values, fill, width=()):
            out = np.full((self.B, *width), fill, np.int32)
            if values:
                out[:len(values)] = values
            return jnp.asarray(out)
        return steps.Admission(
            src=padded([p for p, _, _, _, _ in rows], 0), dst=padded([b for _, b, _, _, _ in rows], self.B),
            lens=padded([len(self.reqs[i][0]) + c for _, _, i, _, c in rows], 0),
            max_new=padded([self.reqs[i][1] for _, _, i, _, _ in rows], 1),
            ids=padded([(self.first_request + i, j) for _, _, i, j, _ in rows], 0, (2,)),
            count=padded([c for *_, c in rows], 0),
            copy_src=padded([a for a, _ in copies], 0), copy_dst=padded([z for _, z in copies], self.pool.num_pages))
