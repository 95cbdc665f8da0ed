"""Logical data shards (vt.data.shards): the global batches and the checkpointed position do not depend on
the number of processes. Processes are simulated in one Python process: process p of P builds the pipeline
with process_index=p, process_count=P, and the global batch is its processes' local batches concatenated along
the row axis (what jax.make_array_from_process_local_data assembles)."""
from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from data_helpers import chat
from data_helpers import tiny_tokenizer_dir, tok  # noqa: F401 (pytest fixtures)

from vt import VtError
from vt.data.chat import tokenize_record
from vt.data.packing import documents_in_row
from vt.data.dataset import PipelineConfig, build_sft_dataset, skip_report
from vt.data.sources import ListSource, Malformed, record_from_dict
from vt.train.synthetic import SyntheticTask, synthetic_dataset

SEQ = 80
SHARDS = 4


def source(n: int = 70, bad_every: int = 0) -> ListSource:
    items = []
    for i in range(n):
        if bad_every and i % bad_every == 3:
            items.append(Malformed("malformed_json", f"mem:{i}", "synthetic"))
        else:
            items.append(record_from_dict(chat(i, n_words=2 + (i * 5) % 19), where=f"mem:{i}", default_id=str(i)))
    return ListSource(items)


def cfg(**kw) -> PipelineConfig:
    base = dict(seq_len=SEQ, global_batch_size=8, grad_accum_steps=2, num_epochs=None, seed=5, read_threads=0,
                num_shards=SHARDS, max_skip_rate=0.5)
    return PipelineConfig(**{**base, **kw})


def processes(src, tok, P: int, **kw) -> list:
    return [iter(build_sft_dataset(src, tok, cfg(**kw), process_index=p, process_count=P)) for p in range(P)]


def global_batch(its: list) -> dict[str, np.ndarray]:
    parts = [next(it) for it in its]
    axis = 1 if parts[0]["input_ids"].ndim == 3 else 0
    return {k: np.concatenate([p[k] for p in parts], axis=axis) for k in parts[0]}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("accum", [2, None])
def test_global_batches_do_not_depend_on_the_process_count(tok, accum):
    src = source(bad_every=11)
    streams = {P: processes(src, tok, P, grad_accum_steps=accum) for P in (1, 2, 4)}
    for step in range(12):  # several epochs of every shard (70 records / 4 shards, a few per row)
        one = global_batch(streams[1])
        assert one["input_ids"].shape == ((2, 4, SEQ) if accum else (8, SEQ))
        assert one["segment_ids"].any()
        for P in (2, 4):
            assert same(global_batch(streams[P]), one), (P, step)
    # Skip counting is per logical shard too: the same totals however the shards are spread.
    totals = {P: collections.Counter() for P in (1, 2, 4)}
    for P, its in streams.items():
        for it in its:
            totals[P].update(skip_report(it).skipped)
    assert totals[1] == totals[2] == totals[4] and totals[1]["malformed_json"] > 0


def test_shards_partition_the_data_and_each_epoch_is_complete(tok):
    src = source(41)
    data = build_sft_dataset(src, tok, cfg(num_epochs=1, grad_accum_steps=None))
    assert data.num_records == 41 and data.plan.owned == (0, 1, 2, 3) and data.plan.rows_per_shard == 2
    batches = list(data)
    docs = collections.Counter(tuple(d["input_ids"].tolist()) for b in batches for r in range(b["input_ids"].shape[0])
                               for d in documents_in_row({k: v[r] for k, v in b.items()}))
    assert len(docs) == 41 and set(docs.values()) == {1}  # every record once
    # Shard s fills rows 2s, 2s+1 of each step, and only with records s, s+4, s+8, ...
    ids = {tuple(tokenize_record(src[i], tok, max_len=SEQ).input_ids.tolist()): i for i in range(41)}
    for b in batches:
        for row in range(8):
            for d in documents_in_row({k: v[row] for k, v in b.items()}):
                assert ids[tuple(d["input_ids"].tolist())] % SHARDS == row // 2
    # Two processes: the same number of global batches (a process whose shards ran out feeds empty rows).
    per_process = [list(build_sft_dataset(src, tok, cfg(num_epochs=1, grad_accum_steps=None), process_index=p,
                                          process_count=2)) for p in range(2)]
    steps = max(len(x) for x in per_process)
    assert steps == len(batches)
    for i in range(steps):
        parts = [x[i] if i < len(x) else None for x in per_process]
        for p, part in enumerate(parts):
            want = {k: v[4 * p:4 * p + 4] for k, v in batches[i].items()}
            if part is None:
                assert not want["segment_ids"].any()
            else:
                assert same(part, want)


def _merge(states: list[dict]) -> dict:
    merged = {"num_shards": states[0]["num_shards"], "shards": {}}
    for s in states:
        merged["shards"].update(s["shards"])
    return json.loads(json.dumps(merged))


@pytest.mark.parametrize("src_p,dst_p", [(2, 1), (1, 2), (4, 2)])
def test_a_position_saved_on_p_processes_resumes_on_another_count(tok, src_p, dst_p):
    src = source(bad_every=9)
    reference = processes(src, tok, 1)
    want = [global_batch(reference) for _ in range(9)]
    its = processes(src, tok, src_p)
    for step in range(4):
        assert same(global_batch(its), want[step])
    state = _merge([it.get_state() for it in its])
    assert sorted(state["shards"]) == ["0", "1", "2", "3"]
    resumed = processes(src, tok, dst_p)
    for it in resumed:
        it.set_state(state)  # each process takes the shards it owns
    for step in range(4, 9):
        assert same(global_batch(resumed), want[step]), step


def test_state_of_another_shard_count_is_refused(tok):
    src = source(30)
    it = iter(build_sft_dataset(src, tok, cfg()))
    state = it.get_state()
    other = iter(build_sft_dataset(src, tok, cfg(num_shards=2)))
    with pytest.raises(VtError, match="num_shards=4, this run uses num_shards=2"):
        other.set_state(state)


def test_shard_arithmetic_is_checked(tok):
    src = source(30)
    with pytest.raises(VtError, match="num_shards=3 must be a positive multiple of the process count"):
        build_sft_dataset(src, tok, cfg(num_shards=3), process_index=0, process_count=2)
    with pytest.raises(VtError, match="num_shards=3 must divide global_batch_size=8"):
        build_sft_dataset(src, tok, cfg(num_shards=3))
    with pytest.raises(VtError, match="grad_accum_steps=2 must divide .*=8 / num_shards=8 = 1"):
        build_sft_dataset(src, tok, cfg(num_shards=8))
    with pytest.raises(VtError, match="logical data shard 7 of 8 .* has no records"):
        build_sft_dataset(ListSource(list(source(7))), tok, cfg(num_shards=8, grad_accum_steps=None))


def test_synthetic_stream_does_not_depend_on_the_process_count():
    kw = dict(seq_len=64, global_batch_size=8, grad_accum_steps=2, seed=3, num_shards=SHARDS)
    streams = {P: [iter(synthetic_dataset(SyntheticTask(), process_index=p, process_count=P, **kw)) for p in range(P)]
               for P in (1, 2, 4)}
    for _ in range(5):
        one = global_batch(streams[1])
        assert one["input_ids"].shape == (2, 4, 64)
        for P in (2, 4):
            assert same(global_batch(streams[P]), one)
    # Resume on 1 process from 2 processes' states.
    state = _merge([it.get_state() for it in streams[2]])
    resumed = iter(synthetic_dataset(SyntheticTask(), **kw))
    resumed.set_state(state)
    for _ in range(3):
        assert same(next(resumed), global_batch(streams[2]))


def test_checkpoint_handler_writes_one_file_per_shard_and_any_count_reads_them(tok, tmp_path):
    """vt.checkpoint.manager's data handler: processes write their own shards; a restore reads the shards it
    owns now (here: 2 simulated writers, 1 reader)."""
    from vt.checkpoint.manager import StateHandler

    src = source(40)
    its = processes(src, tok, 2)
    for _ in range(3):
        global_batch(its)
    handler = StateHandler()
    for it in its:
        handler.save(tmp_path, item=it)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"shard_{s}-of-4.json" for s in range(4)]
    reference = processes(src, tok, 2)
    for _ in range(3):
        global_batch(reference)
    one = processes(src, tok, 1)[0]
    handler.restore(Path(tmp_path), item=one)
    for _ in range(3):
        assert same(next(one), global_batch(reference))
    with pytest.raises(VtError, match=r"shard_0-of-2.json does not exist.*shard_0-of-4.json"):
        handler.restore(tmp_path, item=iter(build_sft_dataset(src, tok, cfg(num_shards=2))))


def test_one_shard_per_process_by_default(tok):
    src = source(30)
    plain = build_sft_dataset(src, tok, PipelineConfig(seq_len=SEQ, global_batch_size=4, num_epochs=1, read_threads=0))
    assert plain.plan.num_shards == 1
    two = build_sft_dataset(src, tok, PipelineConfig(seq_len=SEQ, global_batch_size=4, num_epochs=1, read_threads=0),
                            process_index=1, process_count=2)
    assert two.plan.num_shards == 2 and two.plan.owned == (1,)
    assert list(itertools.islice(iter(plain), 1))[0]["input_ids"].shape == (4, SEQ)
