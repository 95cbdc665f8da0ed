"""The rollout engine: continuous-batching generation over a Qwen2 model with a KV cache.

    engine = Engine(model, SamplerConfig(batch_size=64, max_new_tokens=512, temperature=1.0), mesh=mesh)
    samples = engine.generate([Request(prompt_ids=[...], n=16), ...])   # samples[i][j]: Sample
    engine.update_weights(new_state)                                    # from the learner; no retrace

The host runs a scheduler; the device runs three jitted pure functions (vt.sampling.steps): `prefill`
(prompts padded to a power-of-two length bucket and count), `insert` (copy each prefilled row into the slots
of that prompt's n samples and draw their first tokens) and `decode` (a `lax.while_loop` over up to
`steps_per_call` steps that returns early once enough slots are free to refill). Cache and slot state are
donated. Shapes are bucketed (prompt length and prefill count to powers of two, the cache length to powers
of two and their 1.5x, the insert count fixed at the batch size), so a workload compiles a handful of programs
once and no request recompiles; `engine.compile_count` counts traces.

Randomness: sample j of request i draws its t-th token with fold_in(fold_in(fold_in(key(seed), i), j), t),
so results depend only on (seed, request, sample), not on batch size, slot assignment, refill or sharding.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vt import VtError
from vt.model.qwen2 import KVCache
from vt.sampling import steps
from vt.sampling.rules import SamplingParams
from vt.sampling.stop import default_stop_ids, find_stop_string
from vt.sharding import param_sharding, state_shardings, use_mesh


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    batch_size: int = 64  # decode slots B: samples generated concurrently
    max_new_tokens: int = 256  # default per request; a Request may set its own
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = -1  # -1 = off
    n: int = 1  # samples per request (a Request may set its own); they share one prefill
    seed: int = 0
    stop_token_ids: tuple[int, ...] | None = None  # None: tokenizer eos ids, else the Qwen ids in the vocab
    stop_strings: tuple[str, ...] = ()  # need a tokenizer; checked on the host between decode calls
    max_context: int | None = None  # prompt + completion limit; None: the model's max_position_embeddings
    steps_per_call: int = 64  # most decode steps per host round trip
    refill: bool = True  # False: fixed batches (a batch waits for its longest sample); for comparison
    refill_min_free: int = 0  # free slots that end a decode call while prompts wait; 0: max(1, B // 8)
    prefill_tokens: int = 8192  # most (padded prompts x bucket length) per prefill call
    min_prompt_bucket: int = 16
    min_prefill_rows: int = 8  # prefill batches are padded to a power of two >= this: fewer programs to compile

    def __post_init__(self):
        for name in ("batch_size", "max_new_tokens", "n", "steps_per_call", "prefill_tokens", "min_prompt_bucket",
                     "min_prefill_rows"):
            if getattr(self, name) < 1:
                raise VtError(f"sampler config: field '{name}' must be >= 1, got {getattr(self, name)}")
        if self.stop_strings and any(not s for s in self.stop_strings):
            raise VtError("sampler config: field 'stop_strings' holds an empty string")
        SamplingParams(self.temperature, self.top_p, self.top_k)  # validates


@dataclasses.dataclass(frozen=True)
class Request:
    prompt_ids: Sequence[int]
    max_new_tokens: int | None = None  # None: SamplerConfig.max_new_tokens
    n: int | None = None  # None: SamplerConfig.n


@dataclasses.dataclass
class Sample:
    completion_ids: list[int]  # generated tokens, the stop token included when one ended the sample
    logprobs: list[float]  # log q(token) under the sampling distribution (0.0 for greedy)
    finish_reason: str  # "stop" (stop token or stop string) or "length"
    text: str | None = None  # decoded completion (cut before a stop string) when the engine has a tokenizer


@dataclasses.dataclass
class Stats:
    decode_steps: int = 0  # batched decode steps (each advances all B slots by one token)
    decode_calls: int = 0  # host round trips into the decode loop
    prefill_calls: int = 0
    tokens: int = 0  # completion tokens returned
    seconds: float = 0.0


def _bucket(x: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, x - 1).bit_length())


def _length_bucket(x: int) -> int:
    """Cache length: the next power of two or 1.5 x power of two (decode attention reads all S slots every
    step, so a tighter bucket is faster; two buckets per octave still bound the number of programs)."""
    p = _bucket(x, 16)
    return p * 3 // 4 if x <= p * 3 // 4 and p >= 32 else p


# Host memory generate() holds until it returns, per sample (scheduler queue entry, result slot, Sample object)
# and per generated token (token id and log-prob list slots). Lower bounds on purpose: work refused by them
# cannot fit however it were represented.
HOST_BYTES_PER_SAMPLE = 100
HOST_BYTES_PER_TOKEN = 16


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return ""


def host_memory_bytes() -> int:
    """Physical memory of this host."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_memory_bytes(mesh: Mesh | None = None) -> int:
    """Memory of the devices a sampler uses, together (host memory on the CPU backend)."""
    devices = list(mesh.devices.flat) if mesh is not None else jax.local_devices()[:1]
    if devices[0].platform == "cpu":  # CPU "devices" share the host's memory
        return host_memory_bytes()
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
    return sum(limits) if all(limits) else host_memory_bytes()  # a backend that does not report it


def check_memory(mc, batch_size: int, reqs: Sequence[tuple[np.ndarray, int, int]], max_context: int, *,
                 device_bytes: int, host_bytes: int, batch_name: str = "sampler batch_size",
                 request_name: Callable[[int], str] = lambda i: f"request {i}") -> None:
    """VtError, before anything is allocated, for work that cannot fit: the KV cache and slot state of
    ``batch_size`` decode slots over the cache length these requests need (device memory), or the samples and
    tokens generate() holds until it returns (host memory). ``reqs``: (prompt, max_new_tokens, n) per request,
    as Engine.check returns them. The errors name ``batch_name`` or the request at fault."""
    if not reqs:
        return
    S = _cache_length(reqs, max_context)
    itemsize = jnp.dtype(mc.dtype).itemsize
    cache = 2 * mc.num_layers * batch_size * S * mc.num_kv_heads * mc.head_dim * itemsize
    slots = batch_size * S * 8  # tokens (int32) and log-probs (float32) per slot and position
    if cache + slots > device_bytes:
        raise VtError(f"{batch_name} {batch_size}: the KV cache for {batch_size} slots x {S} positions needs "
                      f"{_human(cache + slots)}, more than the {_human(device_bytes)} of device memory; lower it")
    per_request = [n * (HOST_BYTES_PER_SAMPLE + HOST_BYTES_PER_TOKEN * mn) for _, mn, n in reqs]
    if sum(per_request) > host_bytes:
        i = int(np.argmax(per_request))
        _, mn, n = reqs[i]
        raise VtError(f"{request_name(i)}: n={n} samples of up to {mn} tokens: the requests would hold at least "
                      f"{_human(sum(per_request))} of host memory until they finish, more than this host's "
                      f"{_human(host_bytes)}; lower n or max_new_tokens, or split the input")


def _cache_length(reqs: Sequence[tuple[np.ndarray, int, int]], max_context: int) -> int:
    """Cache positions a generate call allocates: the longest prompt + completion, bucketed."""
    return min(_length_bucket(max(len(p) + mn for p, mn, _ in reqs)), max_context)


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
    """The jitted device functions of one (model structure, batch size, mesh, sampling rule)."""

    def __init__(self, graphdef, mc, B: int, mesh: Mesh | None, params: SamplingParams, stop_ids: tuple[int, ...]):
        self.traces = 0
        sh = None
        if mesh is not None:
            vec = param_sharding(("batch",), (B,), mesh, "sampler slots (batch_size)")
            row = param_sharding(("batch", None), (B, 1), mesh, "sampler slots (batch_size)")
            kv = param_sharding(("batch", "cache_sequence", "kv_heads", "head_dim"),
                                (B, 1, mc.num_kv_heads, mc.head_dim), mesh, "KV cache (batch_size, kv_heads)")
            slots_sh = steps.Slots(last_tok=vec, pos=vec, count=vec, max_new=vec, active=vec, stopped=vec,
                                   key=row, tokens=row, logprobs=row)
            sh = (KVCache(k=[kv] * mc.num_layers, v=[kv] * mc.num_layers), slots_sh)
        out = lambda s: {} if mesh is None else dict(out_shardings=s)  # noqa: E731
        rule = dict(params=params, stop_ids=stop_ids)
        self.prefill = jax.jit(self._counted(functools.partial(steps.prefill, graphdef)))
        self.insert = jax.jit(self._counted(functools.partial(steps.insert, **rule)), donate_argnums=(0, 1),
                              **out(sh))
        self.decode = jax.jit(self._counted(functools.partial(steps.decode, graphdef, **rule)), donate_argnums=(1, 2),
                              **out(sh and (*sh, None)))
        self.deactivate = jax.jit(self._counted(steps.deactivate), donate_argnums=0, **out(sh and sh[1]))
        self.zeros = jax.jit(self._counted(lambda S: (KVCache.zeros(mc, B, S), steps.Slots.zeros(B, S))),
                             static_argnums=0, **out(sh))

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
        self._p = _programs(graphdef, mc, cfg.batch_size, mesh, self.params, self.stop_ids)

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
                 progress: Callable[[int], None] | None = None, first_request: int = 0) -> list[list[Sample]]:
        """Samples for every request, in request order: result[i][j] is sample j of request i.
        seed None: the config's seed plus the number of earlier generate calls (fresh samples each RL step).
        progress(k) is called with the number of samples finished since the last call.
        first_request: the index of requests[0] in a larger batch split over processes; sample j of request i
        draws as request first_request + i would, so a split batch samples what the whole one would."""
        reqs = self.check(requests)
        check_memory(self.model_cfg, self.cfg.batch_size, reqs, self.max_context,
                     device_bytes=device_memory_bytes(self.mesh), host_bytes=host_memory_bytes())
        if seed is None:
            seed, self._calls = self.cfg.seed + self._calls, self._calls + 1
        t0, self.last_stats = time.perf_counter(), Stats()
        results: list[list[Sample | None]] = [[None] * n for _, _, n in reqs]
        if not reqs:
            return []
        B = self.cfg.batch_size
        S = _cache_length(reqs, self.max_context)
        queue = collections.deque((i, j) for i, (_, _, n) in enumerate(reqs) for j in range(n))
        owner: list[tuple[int, int] | None] = [None] * B
        seen = np.zeros(B, np.int64)  # generated count at the last stop-string check
        min_free = self.cfg.refill_min_free or max(1, B // 8)
        with self._ctx():
            cache, slots = self._p.zeros(S)
            base_key = jax.random.PRNGKey(seed)
            while queue or any(o is not None for o in owner):
                free = [b for b in range(B) if owner[b] is None]
                if queue and free and (self.cfg.refill or len(free) == B):
                    units = [queue.popleft() for _ in range(min(len(free), len(queue)))]
                    cache, slots = self._admit(cache, slots, units, free, reqs, base_key, first_request)
                    for u, b in zip(units, free):
                        owner[b] = u
                want = min(len(queue), min_free) if (queue and self.cfg.refill) else B
                cache, slots, n_steps = self._p.decode(self.state, cache, slots, jnp.int32(self.cfg.steps_per_call),
                                                     jnp.int32(want))
                active, count, stopped, n_steps = jax.device_get((slots.active, slots.count, slots.stopped, n_steps))
                self.last_stats.decode_steps += int(n_steps)
                self.last_stats.decode_calls += 1
                owned = [b for b in range(B) if owner[b] is not None]
                done = [b for b in owned if not active[b]]
                cut = self._stop_strings(slots, owned, owner, count, seen, reqs) if self.cfg.stop_strings else {}
                newly = [b for b in cut if active[b]]
                if newly:
                    slots = self._p.deactivate(slots, jnp.asarray(np.isin(np.arange(B), newly)))
                    done += newly
                if done:
                    tokens, logprobs = jax.device_get((slots.tokens, slots.logprobs))
                    for b in done:
                        i, j = owner[b]
                        L, n = len(reqs[i][0]), count[b]
                        results[i][j] = self._sample(tokens[b, L:L + n], logprobs[b, L:L + n], stopped[b], cut.get(b))
                        self.last_stats.tokens += len(results[i][j].completion_ids)
                        owner[b], seen[b] = None, 0
                    if progress is not None:
                        progress(len(done))
        self.last_stats.seconds = time.perf_counter() - t0
        for f in dataclasses.fields(Stats):
            setattr(self.stats, f.name, getattr(self.stats, f.name) + getattr(self.last_stats, f.name))
        return results

    def _text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_strings(self, slots, owned, owner, count, seen, reqs) -> dict[int, tuple[int, str]]:
        """slot -> (tokens to keep, text before the stop string) for samples whose text holds a stop string."""
        fresh = [b for b in owned if count[b] > seen[b]]
        tokens = np.asarray(slots.tokens) if fresh else None
        cut = {}
        for b in fresh:
            seen[b] = count[b]
            L = len(reqs[owner[b][0]][0])
            hit = find_stop_string(tokens[b, L:L + count[b]].tolist(), self._text, self.cfg.stop_strings)
            if hit:
                cut[b] = hit
        return cut

    def _sample(self, ids, logprobs, stopped: bool, cut: tuple[int, str] | None) -> Sample:
        ids, logprobs = ids.tolist(), logprobs.tolist()
        if cut is not None:
            m, text = cut
            return Sample(ids[:m], logprobs[:m], "stop", text)
        return Sample(ids, logprobs, "stop" if stopped else "length",
                      self._text(ids) if self.tokenizer is not None else None)

    def _admit(self, cache, slots, units, free, reqs, base_key, first_request: int = 0):
        """Prefill the distinct prompts of `units` (in groups of at most `prefill_tokens` padded tokens) and
        insert each unit into its slot."""
        B = self.cfg.batch_size
        by_req = collections.defaultdict(list)
        for u, b in zip(units, free):
            by_req[u[0]].append((u[1], b))
        rows = lambda n: min(_bucket(n, self.cfg.min_prefill_rows), _bucket(B))  # noqa: E731
        groups, group, longest = [], [], 0
        for i in by_req:
            longest = max(longest, len(reqs[i][0]))
            if group and rows(len(group) + 1) * _bucket(longest, self.cfg.min_prompt_bucket) > self.cfg.prefill_tokens:
                groups.append(group)
                group, longest = [], len(reqs[i][0])
            group.append(i)
        groups.append(group)
        S = slots.tokens.shape[1]
        for group in groups:
            P = rows(len(group))
            T = min(_bucket(max(len(reqs[i][0]) for i in group), self.cfg.min_prompt_bucket), S)
            toks = np.zeros((P, T), np.int32)
            lens = np.ones(P, np.int32)
            for p, i in enumerate(group):
                toks[p, :len(reqs[i][0])] = reqs[i][0]
                lens[p] = len(reqs[i][0])
            logits, small = self._p.prefill(self.state, jnp.asarray(toks), jnp.asarray(lens))
            units = [(p, i, j, b) for p, i in enumerate(group) for j, b in by_req[i]]
            Q = B  # one insert program per prefill shape; padding rows are dropped
            src, dst, qlen, qmax = (np.zeros(Q, np.int32), np.full(Q, B, np.int32), np.zeros(Q, np.int32),
                                    np.ones(Q, np.int32))
            ids = np.zeros((Q, 2), np.int32)
            for q, (p, i, j, b) in enumerate(units):
                src[q], dst[q], qlen[q], qmax[q], ids[q] = p, b, lens[p], reqs[i][1], (first_request + i, j)
            cache, slots = self._p.insert(cache, slots, small, logits, *map(jnp.asarray, (src, dst, qlen, qmax, ids)),
                                        base_key)
            self.last_stats.prefill_calls += 1
        return cache, slots

