"""Host-side bookkeeping of the paged KV cache: one pool of fixed-size pages, a page table per decode slot.

The device holds the pages themselves (vt.model.paged: [L, K, pages, page_size, H] per K and V); this module
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

import numpy as np

from vt import VtError


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
