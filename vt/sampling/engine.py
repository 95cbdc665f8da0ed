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

Randomness: sample j of request i draws its t-th token with fold_in(fold_in(fold_in(key(seed), i), j), t),
so results depend only on (seed, request, sample), not on batch size, slot assignment, refill or sharding.
"""
from __future__ import annotations

import collections
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
from vt.validation import FieldError


@dataclasses.dataclass
class Sample:
    completion_ids: list[int]  # generated tokens, the stop token included when one ended the sample
    logprobs: list[float]  # log q(token) under the sampling distribution (0.0 for greedy)
    finish_reason: str  # "stop" (stop token or stop string) or "length"
    text: str | None = None  # decoded completion (cut before a stop string) when the engine has a tokenizer
    # [len(completion_ids)] bool: True where the policy sampled the token, False where a tool's turn put it (the
    # learner trains on the policy's tokens only: vt.rl.rollouts.build_rows); None: every token is the policy's
    policy_mask: np.ndarray | None = None


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
    toks: list[int]  # generated so far
    lps: list[float]  # their log-probs
    seen: int = 0  # len(toks) at the last stop-string check


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
        self.queue.appendleft((s.request, s.sample))  # older preempted samples end up in front: request order kept
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
        while self.queue or self._busy():
            # A call cut short only to hand samples over leaves the batch as it is: a smaller batch is a program
            # to compile, which a short run (one decode call per batch without a hook, as the demo's) would pay.
            if not handed_over:
                self._shrink()
            B = self.B
            min_free = cfg.refill_min_free or max(1, B // 8)
            steps = self._pages_for_next_call()
            free = [b for b in range(B) if self.live[b] is None]
            if self.queue and free and (cfg.refill or len(free) == B):
                units = self._take_units(free, steps)
                if not units and len(free) == B:
                    raise VtError("sampler: internal error: the KV pool cannot hold a single waiting sample")
                if units:
                    self._admit(units, free[:len(units)], steps)
            idle = B - len(self._busy())  # > 0 with a queue: admission waits for pages
            # Run until enough slots are free to be worth a refill; when samples wait for pages, until one more
            # sample ends (its pages come back), so each call makes progress. With nothing to refill, until every
            # slot is done, or, when on_finished waits for samples (verification beside decoding), until
            # min_free more are: they are handed over a few at a time, not all at the end of the batch.
            handover = False
            if self.queue and cfg.refill:
                want = idle + max(1, min(len(self.queue), min_free))
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
            newly = [b for b in cut if active[b]]
            if newly:
                self.slots = self.programs.deactivate(self.slots, jnp.asarray(np.isin(np.arange(B), newly)))
                done += newly
            for b in done:
                s = self.live[b]
                results[s.request][s.sample] = sample = self._result(s, bool(stopped[b]), cut.get(b))
                st.tokens += len(sample.completion_ids)
                self.tables.free(b)
                self.live[b] = None
                if on_finished is not None:
                    on_finished(s.request, s.sample, sample)
            if done and progress is not None:
                progress(len(done))
        st.peak_pages = self.pool.peak_in_use
        st.peak_pages_needed = self.tables.peak_needed

    def _text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_strings(self, owned) -> dict[int, tuple[int, str]]:
        """slot -> (tokens to keep, text before the stop string) for samples whose text holds a stop string."""
        cut = {}
        for b in owned:
            s = self.live[b]
            if len(s.toks) > s.seen:
                s.seen = len(s.toks)
                hit = find_stop_string(s.toks, self._text, self.cfg.stop_strings)
                if hit:
                    cut[b] = hit
        return cut

    def _result(self, s: _Slot, stopped: bool, cut: tuple[int, str] | None) -> Sample:
        if cut is not None:
            m, text = cut
            return Sample(s.toks[:m], s.lps[:m], "stop", text)
        return Sample(s.toks, s.lps, "stop" if stopped else "length",
                      self._text(s.toks) if self.tokenizer is not None else None)

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
        if self.queue:
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
                self.cache, self.slots, logits, self._admission(placed, lens, copies), self.base_key)
            tok_Q, lp_Q = jax.device_get((tok_Q, lp_Q))
            for q, (p, i, j, b, k) in enumerate(placed):
                self.live[b] = _Slot(request=i, sample=j, born=self.serial, toks=[int(tok_Q[q])], lps=[float(lp_Q[q])])
                self.serial += 1
                self.tables.assign(b, starts[i][k])
                self.tables.grow(b, self._limit(b, steps))
            st.prefill_calls += 1
        st.prefill_seconds += time.perf_counter() - t

    def _admission(self, placed, lens, copies) -> steps.Admission:
        """The insert call's record of the `placed` samples ((prefill row, request, sample, slot, _) each) and the
        page `copies`, padded to B rows: one insert program per prefill shape; padding rows are dropped."""
        def padded(values, fill, width=()):
            out = np.full((self.B, *width), fill, np.int32)
            if values:
                out[:len(values)] = values
            return jnp.asarray(out)
        return steps.Admission(
            src=padded([p for p, _, _, _, _ in placed], 0), dst=padded([b for _, _, _, b, _ in placed], self.B),
            lens=padded([lens[p] for p, _, _, _, _ in placed], 0),
            max_new=padded([self.reqs[i][1] for _, i, _, _, _ in placed], 1),
            ids=padded([(self.first_request + i, j) for _, i, j, _, _ in placed], 0, (2,)),
            copy_src=padded([a for a, _ in copies], 0), copy_dst=padded([z for _, z in copies], self.pool.num_pages))
