"""First-fit packing of training examples into fixed-length rows (grain's ``FirstFitPackIterDataset``).

Input elements (from :func:`vt.data.chat.to_training_example`): ``input_ids``, ``targets`` (int32 [L]) and
``loss_mask`` (float32 [L], already 0 on each document's last position). Output rows, all of length T::

    input_ids    int32   [T]  tokens; pad_id on padding
    targets      int32   [T]  next token within the same document; pad_id on padding and on each doc's last token
    loss_mask    float32 [T]  1 where the target is an assistant token; 0 on padding, prompts, doc ends
    segment_ids  int32   [T]  1..k for the k documents of the row, in placement order; 0 = padding
    positions    int32   [T]  0,1,2,... restarting at every document; 0 on padding

The model attends only within equal, non-zero segment ids, so packing never leaks across documents, and
because targets were built per document before packing and each doc's last loss_mask is 0, no position is
ever trained to predict the next document's first token.

First fit (grain): ``num_packing_bins`` rows are open at once; each example goes to the first row with room;
when an example fits in no row, all open rows are emitted (in a seeded random order if ``shuffle_bins``)
and a fresh set is opened with that example. More bins, less padding (and more cross-epoch mixing).

:func:`pack_lengths` places a finite list of sequence lengths the same way (the RL learner's samples of one
step), first fit decreasing in numpy: it places sample indices, and the caller gathers each sample's tokens
into the slots it was given.
"""
from __future__ import annotations

import grain
import numpy as np
from grain.experimental import FirstFitPackIterDataset

PACKED_KEYS = ("input_ids", "targets", "loss_mask", "segment_ids", "positions")
_FEATURES = ("input_ids", "targets", "loss_mask")


def _rekey(row: dict) -> dict[str, np.ndarray]:
    # grain names packing metadata per feature; all three features share it, input_ids' copy is kept.
    return {
        "input_ids": row["input_ids"].astype(np.int32),
        "targets": row["targets"].astype(np.int32),
        "loss_mask": row["loss_mask"].astype(np.float32),
        "segment_ids": row["input_ids_segment_ids"].astype(np.int32),
        "positions": row["input_ids_positions"].astype(np.int32),
    }


def pack_first_fit(ds: grain.IterDataset, *, seq_len: int, num_packing_bins: int, pad_id: int,
                   seed: int = 0, shuffle_bins: bool = True) -> grain.IterDataset:
    """Pack a stream of training examples (each at most ``seq_len`` long) into rows of :data:`PACKED_KEYS`.

    The iterator's state (grain's) covers the partially emitted set of bins, so a restore resumes exactly.
    """
    packed = FirstFitPackIterDataset(
        ds,
        length_struct={k: seq_len for k in _FEATURES},
        num_packing_bins=num_packing_bins,
        seed=seed,
        shuffle_bins=shuffle_bins,
        padding_struct={"input_ids": pad_id, "targets": pad_id, "loss_mask": 0.0},
    )
    return packed.map(_rekey)


def pack_lengths(lengths, seq_len: int) -> dict[str, np.ndarray]:
    """First-fit-decreasing placement of sequences of `lengths` (each <= seq_len) into rows of seq_len:
    ``sample`` (int32 [R, seq_len], the index of the sequence in each slot, -1 on padding), ``segment_ids``
    (1..k per row in placement order, 0 = padding) and ``positions`` (restarting at every sequence). Longest
    first, each into the first row with room (first fit decreasing needs at most 11/9 OPT + 1 rows);
    deterministic. The same rows as grain's FirstFitPackIterDataset with enough bins open that none is ever
    flushed (tests/rl/test_packed_rl.py checks it), placed here with one vectorised first-fit search per sequence: grain's
    iterator took 48 ms of host time for the 128 samples of the toy RL step (~0.4 ms a sample), a third of
    the step's update on the device."""
    lengths, order, row_of, offset, segment, fill = _first_fit(lengths, seq_len)
    R = int(np.count_nonzero(fill))
    out = {"sample": np.full((R, seq_len), -1, np.int32), "segment_ids": np.zeros((R, seq_len), np.int32),
           "positions": np.zeros((R, seq_len), np.int32)}
    n = lengths[order]
    k = np.repeat(np.arange(order.size), n)  # placement index of every slot's sequence
    within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    rows, cols = row_of[k], offset[k] + within
    out["sample"][rows, cols] = order[k]
    out["segment_ids"][rows, cols] = segment[k]
    out["positions"][rows, cols] = within
    return out


def packed_rows(lengths, seq_len: int) -> int:
    """How many rows of seq_len :func:`pack_lengths` would fill with sequences of `lengths` (no rows built)."""
    return int(np.count_nonzero(_first_fit(lengths, seq_len)[-1]))


def first_fit_rows(lengths, seq_len: int) -> list[list[int]]:
    """The indices of the sequences of `lengths` that each row of seq_len holds, rows in opening order, each in
    placement order: :func:`pack_lengths`' placement without building rows, in plain Python (for the few
    sequences of an RL group, called per group and row length, it is ~5x faster than the vectorised search)."""
    lengths = [int(n) for n in np.asarray(lengths).reshape(-1)]
    if lengths and (min(lengths) < 1 or max(lengths) > seq_len):
        raise ValueError(f"first_fit_rows: lengths must be in [1, {seq_len}], got {min(lengths)}..{max(lengths)}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # longest first, ties in index order
        r = next((r for r, left in enumerate(room) if left >= lengths[i]), len(room))
        if r == len(room):
            rows.append([])
            room.append(seq_len)
        rows[r].append(i)
        room[r] -= lengths[i]
    return rows


def _first_fit(lengths, seq_len: int):
    """First-fit decreasing: (lengths, placement order, each placed sequence's row, offset in it and segment
    id there, sequences per row opened)."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    if lengths.size and (lengths.min() < 1 or lengths.max() > seq_len):
        raise ValueError(f"pack_lengths: lengths must be in [1, {seq_len}], got {lengths.min()}..{lengths.max()}")
    order = np.argsort(-lengths, kind="stable")
    room = np.full(max(1, lengths.size), seq_len, np.int64)  # every row that could open, in opening order
    fill = np.zeros_like(room)  # sequences placed in each row so far
    row_of, offset, segment = (np.zeros(lengths.size, np.int64) for _ in range(3))
    for k, i in enumerate(order):
        r = int(np.argmax(room >= lengths[i]))  # rows open in order, so the first with room is the first fit
        row_of[k], offset[k] = r, seq_len - room[r]
        fill[r] += 1
        segment[k] = fill[r]
        room[r] -= lengths[i]
    return lengths, order, row_of, offset, segment, fill


def padding_fraction(batch: dict[str, np.ndarray]) -> float:
    """Fraction of positions that are padding (segment id 0): a metric for the packing efficiency."""
    seg = np.asarray(batch["segment_ids"])
    return float((seg == 0).mean()) if seg.size else 0.0


def documents_in_row(row: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Split one packed row back into its documents (tests, debugging): list of per-doc feature arrays."""
    seg = np.asarray(row["segment_ids"])
    docs = []
    for s in range(1, int(seg.max(initial=0)) + 1):
        sel = seg == s
        docs.append({k: np.asarray(row[k])[sel] for k in ("input_ids", "targets", "loss_mask", "positions")})
    return docs
