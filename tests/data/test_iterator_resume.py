"""Checkpointable iterator state and per-process sharding."""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from data_helpers import chat
from data_helpers import tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt.data.packing import documents_in_row
from vt.data.dataset import PipelineConfig, build_sft_dataset, skip_report
from vt.data.sources import ListSource, Malformed, record_from_dict

SEQ = 80


def source(n: int = 50, bad_every: int = 0) -> ListSource:
    items = []
    for i in range(n):
        if bad_every and i % bad_every == 0:
            items.append(Malformed("malformed_json", f"mem:{i}", "synthetic"))
        else:
            items.append(record_from_dict(chat(i, n_words=2 + (i * 5) % 19), where=f"mem:{i}", default_id=str(i)))
    return ListSource(items)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("threads", [0, 2])
def test_restore_resumes_the_exact_batch_sequence(tok, threads):
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=4, grad_accum_steps=2, num_epochs=3, seed=7,
                         num_packing_bins=3, read_threads=threads, max_skip_rate=0.5)
    src = source(bad_every=9)
    reference = list(build_sft_dataset(src, tok, cfg))
    assert len(reference) > 10
    it = iter(build_sft_dataset(src, tok, cfg))
    # Save at several points (mid packed group, across epoch boundaries), restore into a fresh pipeline.
    for step in range(len(reference)):
        if step % 4 == 1:
            state = json.loads(json.dumps(it.get_state()))  # the state is plain JSON (Orbax/grain friendly)
            fresh = iter(build_sft_dataset(src, tok, cfg))
            fresh.set_state(state)
            rest = list(fresh)
            assert len(rest) == len(reference) - step
            assert all(same(x, y) for x, y in zip(rest, reference[step:]))
        assert same(next(it), reference[step])
    with pytest.raises(StopIteration):
        next(it)


def test_restored_skip_counts_are_consistent(tok):
    cfg = PipelineConfig(seq_len=SEQ, global_batch_size=2, num_epochs=1, seed=0, read_threads=0,
                         max_skip_rate=0.5)
    src = source(bad_every=5)
    it = iter(build_sft_dataset(src, tok, cfg))
    for _ in range(5):
        next(it)
    fresh = iter(build_sft_dataset(src, tok, cfg))
    fresh.set_state(it.get_state())
    list(it), list(fresh)
    assert skip_report(fresh).skipped == skip_report(it).skipped == {"malformed_json": 10}
    assert skip_report(fresh).seen == skip_report(it).seen == 50


def test_process_shards_are_disjoint_and_cover_the_data(tok):
    src = source(47)
    shares = []
    for p in range(3):
        cfg = PipelineConfig(seq_len=SEQ, global_batch_size=6, num_epochs=1, seed=11, read_threads=0)
        data = build_sft_dataset(src, tok, cfg, process_index=p, process_count=3)
        assert data.num_records == len(range(p, 47, 3))
        batches = list(data)
        assert all(b["input_ids"].shape == (2, SEQ) for b in batches)  # 6 global rows / 3 processes
        shares.append(collections.Counter(tuple(d["input_ids"].tolist()) for b in batches
                                          for r in range(b["input_ids"].shape[0])
                                          for d in documents_in_row({k: v[r] for k, v in b.items()})))
    union = sum(shares, collections.Counter())
    assert all(c == 1 for c in union.values())  # no document in two shares (or twice in one)
    assert len(union) == 47  # and together they cover the data
