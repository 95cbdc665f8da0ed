"""Padded lengths for compiled shapes: one bucket series for every variable size vt pads to (prompt and cache
lengths in the sampler, rows in distill scoring, batch rows in the scheduler), so a run compiles a handful of
programs rather than one per size."""
from __future__ import annotations


def bucket(n: int, lo: int = 1, *, half_octaves: bool = False) -> int:
    """The smallest bucket >= n and >= lo: a power of two, or with `half_octaves` also 1.5x a power of two
    (16, 24, 32, 48, 64, ...: at most a third of a row wasted on padding, two programs per octave). `lo` should
    itself be a bucket of the series."""
    p = 1 << max(0, n - 1).bit_length()
    if half_octaves and p >= 4 and max(n, lo) <= p * 3 // 4:
        return p * 3 // 4
    return max(lo, p)
