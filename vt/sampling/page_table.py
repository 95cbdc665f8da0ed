"""The host half of the paged KV cache: how many pages the pool gets (the memory plan, checked before anything
is allocated), and which page holds which tokens (a reference-counted pool, a page table per decode slot).

The device holds the pages themselves (vt.model.kv_pages: [L, K, pages, page_size, H] per K and V); this module
decides which page holds which tokens. A sample owns pages only for the tokens it has (plus the lookahead
of the next decode call), returns them when it finishes, and the n samples of one prompt share the prompt's
full pages (reference counts). A prompt's partly filled last page is copied for every sample but the last
one admitted with it (copy-on-write: each sample then writes its own tokens into its own copy).

Every decision here is a deterministic function of the call sequence (lowest free page first, youngest
sample preempted first), so a workload replays exactly; and since a sample's tokens depend only on its
keys (vt.sampling.engine), where its pages are and whether it was preempted and restarted change nothing.
"""
from __future__ import annotations

import heapq
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vt import VtError
from vt.buckets import bucket


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def pool_pages(kv_pages: int, kv_memory_fraction: float, page_bytes: int, worst_case: int,
               free_device_bytes: int | None) -> int:
    """Pool size: `kv_pages` when > 0, else `kv_memory_fraction` of the free device memory, never more than
    `worst_case` (every slot at its longest, which never waits); without memory statistics (CPU) the worst
    case itself."""
    if kv_pages > 0:
        return kv_pages
    if free_device_bytes is None:
        return worst_case
    return max(1, min(worst_case, int(free_device_bytes * kv_memory_fraction) // page_bytes))


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


def free_device_bytes(mesh: Mesh | None = None) -> int | None:
    """Free memory of the devices the KV pool is split over (its tensor axis), or None where the backend does not
    report it (CPU): the pool is then sized for the worst case."""
    stats = jax.local_devices()[0].memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    return free * (mesh.shape.get("tensor", 1) if mesh is not None else 1)  # the pool is split over tensor only


def kv_pool_plan(mc, cfg, reqs: Sequence[tuple[np.ndarray, int, int]], max_context: int,
                 free_bytes: int | None) -> tuple[int, int, int]:
    """(page table width M, bytes of one page over all layers with K and V, pages in the pool) for these requests
    under the model config `mc` and SamplerConfig `cfg`: one home for the sizes the scheduler allocates and the
    up-front memory check refuses."""
    M = pages_for(_cache_length(reqs, max_context), cfg.page_size)
    page_bytes = 2 * mc.num_layers * mc.num_kv_heads * cfg.page_size * mc.head_dim * jnp.dtype(mc.dtype).itemsize
    pool = pool_pages(cfg.kv_pages, cfg.kv_memory_fraction, page_bytes, cfg.batch_size * M, free_bytes)
    return M, page_bytes, pool


def check_memory(mc, cfg, reqs: Sequence[tuple[np.ndarray, int, int]], max_context: int, *,
                 device_bytes: int, host_bytes: int, free_bytes: int | None = None,
                 batch_name: str = "sampler batch_size", request_name: Callable[[int], str] = lambda i: f"request {i}"
                 ) -> None:
    """VtError, before anything is allocated, for work that cannot fit: the KV page pool these requests get
    (kv_pool_plan: the worst case where free memory is not reported) plus the slots' page tables and per-call
    outputs (device memory), or the samples and tokens generate() holds until it returns (host memory).
    ``reqs``: (prompt, max_new_tokens, n) per request, as Engine.check returns them. The errors name
    ``batch_name`` (or kv_pages when that sized the pool) or the request at fault."""
    if not reqs:
        return
    B = cfg.batch_size
    M, page_bytes, pool = kv_pool_plan(mc, cfg, reqs, max_context, free_bytes)
    need = pool * page_bytes + B * M * 4 + B * cfg.steps_per_call * 8
    if need > device_bytes:
        what = (f"sampler config kv_pages {cfg.kv_pages}" if cfg.kv_pages else
                f"{batch_name} {B}")
        raise VtError(f"{what}: the KV cache ({pool} pages: {B} slots x {M} pages of {cfg.page_size} tokens at most) "
                      f"and slot state need {_human(need)}, more than the {_human(device_bytes)} of device memory; "
                      "lower it")
    per_request = [n * (HOST_BYTES_PER_SAMPLE + HOST_BYTES_PER_TOKEN * mn) for _, mn, n in reqs]
    if sum(per_request) > host_bytes:
        i = int(np.argmax(per_request))
        _, mn, n = reqs[i]
        raise VtError(f"{request_name(i)}: n={n} samples of up to {mn} tokens: the requests would hold at least "
                      f"{_human(sum(per_request))} of host memory until they finish, more than this host's "
                      f"{_human(host_bytes)}; lower n or max_new_tokens, or split the input")


def _cache_length(reqs: Sequence[tuple[np.ndarray, int, int]], max_context: int) -> int:
    """Cache positions a slot may need in a generate call: the longest prompt + completion, bucketed (the page
    table's width is a compiled shape; two buckets per octave keep the table tight and the programs few)."""
    return min(bucket(max(len(p) + mn for p, mn, _ in reqs), 16, half_octaves=True), max_context)


class PagePool:
    """Reference-counted pages 0..num_pages-1, handed out lowest id first."""

    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise VtError(f"KV page pool: needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages))  # a heap; already sorted
        self.refs = np.zeros(num_pages, np.int32)
        self.peak_in_use = 0

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        return self.num_pages - len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise VtError(f"KV page pool: {n} pages wanted, {len(self._free)} free (the scheduler checks first)")
        pages = [heapq.heappop(self._free) for _ in range(n)]
        self.refs[pages] = 1
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return pages

    def share(self, pages) -> None:
        for p in pages:
            assert self.refs[p] > 0, f"page {p} is free"
            self.refs[p] += 1

    def release(self, pages) -> None:
        for p in pages:
            assert self.refs[p] > 0, f"page {p} released twice"
            self.refs[p] -= 1
            if self.refs[p] == 0:
                heapq.heappush(self._free, p)


class PageTables:
    """The page list of every decode slot over one pool, and its [B, max_pages] table for the device.

    Table entries a slot does not own hold `unowned` (= num_pages): the device drops writes there and clamps
    reads, which the attention masks by position anyway.
    """

    def __init__(self, pool: PagePool, batch: int, max_pages: int, page_size: int):
        self.pool, self.page_size, self.max_pages = pool, page_size, max_pages
        self.unowned = pool.num_pages
        self.table = np.full((batch, max_pages), self.unowned, np.int32)
        self.pages: list[list[int]] = [[] for _ in range(batch)]
        self.peak_needed = 0  # most pages the live tokens needed at one time (shared pages once)

    def covered(self, b: int) -> int:
        """Tokens slot b's pages can hold."""
        return len(self.pages[b]) * self.page_size

    def missing(self, b: int, tokens: int) -> int:
        """Pages slot b lacks to hold `tokens` tokens."""
        return max(0, pages_for(min(tokens, self.max_pages * self.page_size), self.page_size) - len(self.pages[b]))

    def grow(self, b: int, tokens: int) -> None:
        """Give slot b pages for `tokens` tokens (the pool must have them: check `missing` first)."""
        new = self.pool.alloc(self.missing(b, tokens))
        start = len(self.pages[b])
        self.pages[b] += new
        self.table[b, start:start + len(new)] = new

    def assign(self, b: int, pages: list[int]) -> None:
        """Slot b (empty) takes `pages`, already counted for it in the pool."""
        assert not self.pages[b], f"slot {b} still holds pages"
        self.pages[b] = list(pages)
        self.table[b, :len(pages)] = pages

    def take(self, rows: list[int]) -> None:
        """Keep only slots `rows`, renumbered 0..len(rows)-1 (the decode batch shrinks); the dropped slots
        hold no pages."""
        assert all(not self.pages[b] for b in set(range(len(self.pages))) - set(rows)), "dropped slot holds pages"
        self.table = self.table[rows]
        self.pages = [self.pages[b] for b in rows]

    def detach(self, b: int, tokens: int) -> list[int]:
        """Take slot b's pages off its row, keeping (not releasing) those that hold its first `tokens` tokens and
        releasing the rest: a sample parked during a tool call keeps its prefix while its slot runs another."""
        keep, pages = pages_for(tokens, self.page_size), self.pages[b]
        self.pool.release(pages[keep:])
        self.pages[b] = []
        self.table[b] = self.unowned
        return pages[:keep]

    def free(self, b: int) -> None:
        self.pool.release(self.pages[b])
        self.pages[b] = []
        self.table[b] = self.unowned

    def note_live(self, live_tokens_by_page_owner: int) -> None:
        self.peak_needed = max(self.peak_needed, live_tokens_by_page_owner)


def prompt_pages(pool: PagePool, prompt_len: int, n_samples: int, page_size: int) -> tuple[list[int], list[list[int]],
                                                                                          list[tuple[int, int]]]:
    """Pages for one prompt prefilled once and continued by `n_samples` samples.

    Returns (the prompt's pages, which the prefill writes; each sample's initial page list; (source, copy)
    page pairs the device must copy before the samples write). Full pages are shared by all samples; the
    partly filled last page goes to the last sample and is copied for the others (copy-on-write: it is the
    only page a sample writes that others read). The caller checks `pool.free` against `prompt_need` first.
    """
    n_full, partial = divmod(prompt_len, page_size)
    own = pool.alloc(pages_for(prompt_len, page_size))
    full, last = own[:n_full], own[n_full:]
    pool.share(full * (n_samples - 1))
    per_sample, copies = [], []
    for j in range(n_samples):
        if partial and j < n_samples - 1:
            [copy] = pool.alloc(1)
            copies.append((last[0], copy))
            per_sample.append(full + [copy])
        else:
            per_sample.append(full + last)
    return own, per_sample, copies


def prompt_need(prompt_len: int, n_samples: int, page_size: int) -> int:
    """Pool pages `prompt_pages` takes."""
    return pages_for(prompt_len, page_size) + (n_samples - 1 if prompt_len % page_size else 0)
