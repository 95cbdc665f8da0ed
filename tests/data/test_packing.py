"""Packing through the grain pipeline: row invariants, no token lost, first-fit placement, batch shapes."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from data_helpers import chat
from data_helpers import tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt import VtError
from vt.data.chat import tokenize_record
from vt.data.packing import PACKED_KEYS, documents_in_row, padding_fraction
from vt.data.dataset import PipelineConfig, build_sft_dataset, count_tokens
from vt.data.sources import ListSource, record_from_dict

SEQ = 96


def make_source(n: int = 60) -> ListSource:
    # Lengths vary (3..30 filler words) so rows hold different numbers of documents.
    return ListSource([record_from_dict(chat(i, n_words=3 + (i * 7) % 28), where=f"mem:{i}", default_id=str(i))
                       for i in range(n)])


def all_rows(batches) -> list[dict[str, np.ndarray]]:
    rows = []
    for b in batches:
        flat = {k: v.reshape(-1, v.shape[-1]) for k, v in b.items()}
        rows += [{k: flat[k][r] for k in flat} for r in range(flat["input_ids"].shape[0])]
    return rows


def check_row(row: dict[str, np.ndarray], pad_id: int) -> None:
    seg, pos, ids, tgt, lm = (row[k] for k in ("segment_ids", "positions", "input_ids", "targets", "loss_mask"))
    n_docs = int(seg.max())
    used = seg > 0
    # Documents occupy a prefix of the row, as contiguous blocks numbered 1..k in order; then padding.
    assert not used[np.argmin(used):].any() if not used.all() else True
    starts = np.flatnonzero(np.diff(np.concatenate([[0], seg])) != 0)
    assert list(seg[starts][seg[starts] > 0]) == list(range(1, n_docs + 1))
    for s in range(1, n_docs + 1):
        idx = np.flatnonzero(seg == s)
        assert np.array_equal(idx, np.arange(idx[0], idx[-1] + 1))  # contiguous
        np.testing.assert_array_equal(pos[idx], np.arange(len(idx)))  # positions restart at 0
        np.testing.assert_array_equal(tgt[idx[:-1]], ids[idx[1:]])  # next token within the document
        assert tgt[idx[-1]] == pad_id and lm[idx[-1]] == 0.0  # no target across documents
    assert (lm[~used] == 0).all() and (pos[~used] == 0).all() and (ids[~used] == pad_id).all()
    assert set(np.unique(lm)) <= {0.0, 1.0}


def test_rows_are_well_formed_and_no_token_is_lost(tok):
    src = make_source()
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=4, num_epochs=1, seed=3, read_threads=2)
    batches = list(build_sft_dataset(src, tok, cfg))
    for b in batches:
        assert set(b) == set(PACKED_KEYS) and all(v.shape == (4, SEQ) for v in b.values())
        assert b["input_ids"].dtype == np.int32 and b["loss_mask"].dtype == np.float32
        assert b["segment_ids"].dtype == np.int32 and b["positions"].dtype == np.int32
    rows = all_rows(batches)
    for row in rows:
        check_row(row, tok.pad_token_id)
    packed = collections.Counter(tuple(d["input_ids"].tolist()) for r in rows for d in documents_in_row(r))
    expected = collections.Counter(tuple(tokenize_record(src[i], tok, max_len=SEQ).input_ids.tolist())
                                   for i in range(len(src)))
    assert packed == expected  # every document exactly once, unaltered
    # Loss tokens: exactly the per-document assistant targets.
    want_loss = sum(int(tokenize_record(src[i], tok, max_len=SEQ).token_mask[1:].sum()) for i in range(len(src)))
    assert sum(count_tokens(b)["loss_tokens"] for b in batches) == want_loss
    assert 0.0 <= padding_fraction(batches[0]) < 0.5


def simulate_first_fit(lengths: list[int], seq_len: int, bins: int) -> list[list[int]]:
    """Reference first fit with grain's flushing rule: when an item fits no open bin, emit the non-empty bins
    and restart with it. Returns per-row lists of item indices."""
    rows_out, open_bins, fill = [], [[] for _ in range(bins)], [0] * bins
    for i, n in enumerate(lengths):
        target = next((b for b in range(bins) if fill[b] + n <= seq_len), None)
        if target is None:
            rows_out += [b for b in open_bins if b]
            open_bins, fill, target = [[] for _ in range(bins)], [0] * bins, 0
        open_bins[target].append(i)
        fill[target] += n
    return rows_out + [b for b in open_bins if b]


@pytest.mark.parametrize("bins", [1, 3])
def test_first_fit_placement(tok, bins):
    src = make_source(40)
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=3, num_epochs=1, shuffle=False, num_packing_bins=bins,
                         read_threads=0)
    rows = [r for r in all_rows(build_sft_dataset(src, tok, cfg)) if r["segment_ids"].any()]
    toks = [tokenize_record(src[i], tok, max_len=SEQ).input_ids.tolist() for i in range(len(src))]
    expected = simulate_first_fit([len(t) for t in toks], SEQ, bins)
    got = [[d["input_ids"].tolist() for d in documents_in_row(r)] for r in rows]
    assert got == [[toks[i] for i in row] for row in expected]


def test_grad_accum_shape_and_final_batch_padding(tok):
    src = make_source(30)
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=8, grad_accum_steps=2, num_epochs=1, read_threads=0)
    batches = list(build_sft_dataset(src, tok, cfg))
    assert all(v.shape == (2, 4, SEQ) for b in batches for v in b.values())
    last = batches[-1]["segment_ids"].reshape(-1, SEQ)
    assert (last[-1] == 0).all()  # topped up with an empty row rather than dropping documents
    with pytest.raises(VtError, match="grad_accum_steps=3"):
        build_sft_dataset(src, tok, PipelineConfig(seq_len=SEQ, global_batch_size=8, grad_accum_steps=3))
    with pytest.raises(VtError, match="multiple of process_count"):
        build_sft_dataset(src, tok, PipelineConfig(seq_len=SEQ, global_batch_size=6), process_index=0,
                          process_count=4)


def test_epochs_reshuffle(tok):
    src = make_source(20)
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=2, num_epochs=2, seed=1, read_threads=0,
                         num_packing_bins=1)
    docs = [tuple(d["input_ids"].tolist()) for r in all_rows(build_sft_dataset(src, tok, cfg))
            for d in documents_in_row(r)]
    # One bin keeps stream order, so rows 0..19 hold epoch 1: each epoch is a full pass, in a new order.
    assert len(docs) == 40 and len(set(docs[:20])) == 20 and set(docs[:20]) == set(docs[20:])
    assert docs[:20] != docs[20:]
