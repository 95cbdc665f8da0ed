"""The SFT input pipeline: source -> shard -> shuffle -> epochs -> tokenise -> count skips -> pack -> batch.

    data = build_sft_dataset(source, tokenizer, PipelineConfig(seq_len=4096, global_batch_size=128),
                             process_index=jax.process_index(), process_count=jax.process_count())
    it = iter(data)                 # a grain DatasetIterator
    batch = next(it)                # dict of numpy arrays, see below
    state = it.get_state()          # JSON-able; it.set_state(state) resumes the exact batch sequence
    report = skip_report(it)        # SkipReport: per-reason counts and example file:line locations

Batches (per process): ``input_ids``/``targets``/``segment_ids``/``positions`` int32 and ``loss_mask``
float32, shaped ``[B, T]`` with ``B = global_batch_size / process_count`` packed rows, or
``[grad_accum_steps, B / grad_accum_steps, T]`` when ``grad_accum_steps`` is set (even to 1), so the
learner can scan over micro-batches. Keys and conventions: :mod:`vt.data.packing`. The loss normaliser
(tokens per step) is ``loss_mask.sum()`` over the global batch. With finite epochs the last batch is
topped up with empty rows (segment 0, loss_mask 0) instead of being dropped: no example is lost.

Logical shards (:mod:`vt.data.shards`): the records are split into ``num_shards`` logical shards, shard s
holding records ``s, s+S, s+2S, ...``; each is shuffled (its own seed, from ``seed`` and s), tokenised,
skip-counted, packed and batched on its own, and a step's global batch is every shard's next
``global_batch_size / num_shards`` rows, in shard order. Process p owns shards ``[p*S/P, (p+1)*S/P)`` and
yields exactly its rows of that global batch; the iterator state is kept per logical shard. With a fixed
``num_shards`` the global batches (and a checkpointed position) are therefore the same for any process count
that divides it: a run can move between 1 and P processes. ``num_shards=None`` means one shard per process
(the stream then depends on the process count). With finite epochs shards may run out at different batches;
an exhausted shard contributes empty rows until all of this process's shards are exhausted.

Multi-host: ``process_index``/``process_count`` are passed in (not read from jax here, so the data layer
stays importable without initialising a backend). Each process reads only the records of its own shards;
the shares are disjoint and cover the data. With finite epochs the processes may reach the end a batch
apart: a multi-host learner runs a fixed number of steps (``num_epochs=None``, repeating) and pads
evaluation batches across processes rather than stop on one process's StopIteration.

Skips: malformed records and records rejected at tokenisation are counted per reason (never silently
dropped); once ``skip_check_min_records`` records of a logical shard have been seen, a skip rate above
``max_skip_rate`` in that shard raises :class:`vt.VtError` with the report. At construction, the first
``probe_records`` records of this process's share (split evenly over its shards) are tokenised: if none can
be used (e.g. every prompt is longer than ``seq_len``) or the probe's skip rate is above the threshold,
construction fails at once, not hours into a run.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any

import grain
import numpy as np

from vt import VtError
from vt.data import chat
from vt.data.packing import PACKED_KEYS, pack_first_fit
from vt.data.shards import LogicalShardsIterDataset, ShardPlan, plan_shards, shard_seed
from vt.data.tokenizer import Tokenizer

_KEEP_EXAMPLES = 5  # locations kept per skip reason, for the report


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Data-pipeline settings (the stage configs carry these).

    seq_len: packed row length T (tokens); each example is cut or dropped to fit (``overlong``).
    global_batch_size: packed rows per optimiser step over all processes (RECIPE: 128).
    grad_accum_steps: None -> batches [B, T]; k -> [k, B/k, T] (micro-batches of one step).
    num_epochs: passes over the data; None repeats forever (each epoch reshuffled with seed + epoch).
    seed: shuffle and bin-order seed (each logical shard derives its own). shuffle: shuffle records (off for
        eval/debugging).
    overlong: "truncate_right" (keep the first seq_len tokens) or "drop".
    vocab_size: the model's vocabulary; ids outside [0, vocab_size) skip the record (None: tokenizer's).
    num_packing_bins: rows filled at once by first-fit packing, per logical shard (None: the rows a shard gives
        each step, global_batch_size / num_shards).
    max_skip_rate / skip_check_min_records: fail when skipped/seen exceeds the rate, after this many.
    probe_records: records tokenised at construction to catch configs that can never fit.
    read_threads: grain reader threads that run tokenisation in parallel (0 = in the calling thread), shared
        out over this process's shards.
    num_shards: logical data shards (see the module docstring): a multiple of the process count that divides
        global_batch_size, and that grad_accum_steps divides global_batch_size / num_shards. None: one per
        process (the stream then depends on the process count).
    """

    seq_len: int
    global_batch_size: int
    grad_accum_steps: int | None = None
    num_epochs: int | None = 1
    seed: int = 0
    shuffle: bool = True
    overlong: str = chat.TRUNCATE_RIGHT
    vocab_size: int | None = None
    num_packing_bins: int | None = None
    max_skip_rate: float = 0.05
    skip_check_min_records: int = 100
    probe_records: int = 256
    read_threads: int = 4
    num_shards: int | None = None


@dataclasses.dataclass
class SkipReport:
    """Counts since the iterator started (or since its restored state): ``seen`` records, ``used`` ones,
    ``truncated`` (used but cut), ``skipped`` per reason, and up to 5 ``examples`` (``file:line: detail``)
    per reason."""

    seen: int = 0
    used: int = 0
    truncated: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def skip_rate(self) -> float:
        return self.num_skipped / self.seen if self.seen else 0.0

    def add_skip(self, skip: chat.Skip) -> None:
        self.seen += 1
        self.skipped[skip.reason] = self.skipped.get(skip.reason, 0) + 1
        kept = self.examples.setdefault(skip.reason, [])
        if len(kept) < _KEEP_EXAMPLES:
            kept.append(f"{skip.where}: {skip.detail}")

    def summary(self) -> str:
        lines = [f"{self.seen} records seen, {self.used} used ({self.truncated} truncated), "
                 f"{self.num_skipped} skipped ({100 * self.skip_rate:.1f}%)"]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {reason}: {n}, e.g. " + "; ".join(self.examples.get(reason, [])[:3]))
        return "\n".join(lines)

    def to_state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "SkipReport":
        return cls(seen=int(state["seen"]), used=int(state["used"]), truncated=int(state["truncated"]),
                   skipped={k: int(v) for k, v in state["skipped"].items()},
                   examples={k: list(v) for k, v in state["examples"].items()})


class _Tokenize(grain.transforms.Map):
    """Record | Malformed -> Tokenized | Skip (pure, so grain can run it on reader threads)."""

    def __init__(self, tokenizer: Tokenizer, config: PipelineConfig):
        self._tokenizer = tokenizer
        self._kw = dict(max_len=config.seq_len, overlong=config.overlong, vocab_size=config.vocab_size)

    def map(self, record):
        return chat.tokenize_record(record, self._tokenizer, **self._kw)


_DTYPES = {"input_ids": np.int32, "targets": np.int32, "loss_mask": np.float32, "segment_ids": np.int32,
           "positions": np.int32}


def _empty_rows(rows: int, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Rows with no document: pad tokens, segment 0, positions 0, no loss."""
    return {k: np.full((rows, seq_len), pad_id if k in ("input_ids", "targets") else 0, dtype=_DTYPES[k])
            for k in PACKED_KEYS}


class _StackAndPad:
    """Stack rows into [rows, T]; a short final batch gets empty rows (pad tokens, segment 0, mask 0)."""

    def __init__(self, rows: int, seq_len: int, pad_id: int):
        self._rows, self._seq_len, self._pad_id = rows, seq_len, pad_id

    def __call__(self, rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        out = {k: np.stack([r[k] for r in rows]) for k in PACKED_KEYS}
        missing = self._rows - len(rows)
        if missing:
            fill = _empty_rows(missing, self._seq_len, self._pad_id)
            out = {k: np.concatenate([v, fill[k].astype(v.dtype)]) for k, v in out.items()}
        return out


class _CountSkipsIterator(grain.DatasetIterator):
    """Drops Skip items after counting them; turns Tokenized into next-token training examples.

    Counting lives here, in the single consumer thread, not in the (parallel) map: counts then depend only
    on how far the iterator has advanced, and they are part of its checkpointable state.
    """

    def __init__(self, parent: grain.DatasetIterator, *, pad_id: int, max_skip_rate: float, min_records: int):
        super().__init__(parent)
        self._pad_id = pad_id
        self._max_skip_rate = max_skip_rate
        self._min_records = min_records
        self.report = SkipReport()

    def __next__(self):
        while True:
            item = next(self._parent)
            if isinstance(item, chat.Skip):
                self.report.add_skip(item)
                if self.report.seen >= self._min_records and self.report.skip_rate > self._max_skip_rate:
                    raise VtError(f"data skip rate {100 * self.report.skip_rate:.1f}% is above "
                                  f"max_skip_rate {100 * self._max_skip_rate:.1f}%:\n{self.report.summary()}")
                continue
            self.report.seen += 1
            self.report.used += 1
            self.report.truncated += int(item.truncated)
            return chat.to_training_example(item, self._pad_id)

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "report": self.report.to_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self.report = SkipReport.from_state(state["report"])


class _CountSkipsIterDataset(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, **kwargs):
        super().__init__(parent)
        self._kwargs = kwargs

    def __iter__(self) -> _CountSkipsIterator:
        return _CountSkipsIterator(self._parent.__iter__(), **self._kwargs)


def skip_report(iterator: grain.DatasetIterator) -> SkipReport:
    """The :class:`SkipReport` of an iterator made by :func:`build_sft_dataset` (found by walking its parents):
    the live report with one logical shard, else the sum over this process's shards (a snapshot)."""
    found, todo = [], [iterator]
    while todo:
        it = todo.pop(0)
        if isinstance(it, _CountSkipsIterator):
            found.append(it.report)
            continue
        todo.extend(getattr(it, "_parents", ()))
    if not found:
        raise VtError("skip_report: this iterator was not built by vt.data.dataset.build_sft_dataset")
    return found[0] if len(found) == 1 else _merge_reports(found)


def _merge_reports(reports: list[SkipReport]) -> SkipReport:
    out = SkipReport()
    for r in reports:
        out.seen += r.seen
        out.used += r.used
        out.truncated += r.truncated
        for reason, n in r.skipped.items():
            out.skipped[reason] = out.skipped.get(reason, 0) + n
        for reason, ex in r.examples.items():
            kept = out.examples.setdefault(reason, [])
            kept.extend(ex[:max(0, _KEEP_EXAMPLES - len(kept))])
    return out


def _validate(config: PipelineConfig, process_index: int, process_count: int) -> ShardPlan:
    if config.seq_len < 2:
        raise VtError(f"seq_len={config.seq_len}: packing needs at least 2 tokens (an input and its target)")
    plan = plan_shards(global_rows=config.global_batch_size, micro_batches=config.grad_accum_steps,
                       num_shards=config.num_shards, process_index=process_index, process_count=process_count)
    if config.overlong not in chat.OVERLONG_POLICIES:
        raise VtError(f"overlong={config.overlong!r}: expected one of {chat.OVERLONG_POLICIES}")
    if not 0.0 <= config.max_skip_rate <= 1.0:
        raise VtError(f"max_skip_rate={config.max_skip_rate} must be in [0, 1]")
    if config.num_epochs is not None and config.num_epochs <= 0:
        raise VtError(f"num_epochs={config.num_epochs} must be positive (or None to repeat forever)")
    return plan


class _TokenizeOnce(grain.transforms.MapWithIndex):
    """The tokenise map of a shard's stream, handing out the probe's results for the records it already did.

    Index i < len(shard) is epoch 0's i-th record, the same record the probe tokenised as ``mapped[i]``
    (shuffling is per epoch and indexed), so the result is reused instead of tokenising it twice (the probe
    covers up to ``probe_records`` records: a large share of a small data set). Each result is handed out once
    and then dropped; tokenisation is deterministic, so a resumed or repeated index simply tokenises again.
    """

    def __init__(self, tokenize: _Tokenize, probed: dict[int, Any]):
        self._tokenize = tokenize
        self._probed = probed

    def map_with_index(self, index: int, record):
        done = self._probed.pop(index, None)  # dict.pop is atomic: safe on grain's reader threads
        return done if done is not None else self._tokenize.map(record)


def _probe(shards: list[grain.MapDataset], n: int, config: PipelineConfig,
           results: list[dict[int, Any]] | None = None) -> SkipReport:
    """Tokenise up to `n` records, split evenly over `shards` (each already mapped to Tokenized | Skip); each
    shard's results go to ``results[k][index]`` when given. Runs on ``read_threads`` threads, as the stream
    does (the tokenizer releases the GIL), and counts in record order."""
    report, probed = SkipReport(), 0
    per_shard = -(-n // len(shards))
    todo = [(k, i) for k, mapped in enumerate(shards) for i in range(min(per_shard, len(mapped)))]
    fetch = lambda ki: shards[ki[0]][ki[1]]  # noqa: E731
    if config.read_threads > 1:
        with concurrent.futures.ThreadPoolExecutor(config.read_threads) as pool:
            items = list(pool.map(fetch, todo))
    else:
        items = [fetch(ki) for ki in todo]
    for (k, i), item in zip(todo, items):
        if results is not None:
            results[k][i] = item
        probed += 1
        if isinstance(item, chat.Skip):
            report.add_skip(item)
        else:
            report.seen += 1
            report.used += 1
            report.truncated += int(item.truncated)
    if report.used == 0:
        raise VtError(f"no usable example among the first {probed} records of this process's share with "
                      f"seq_len={config.seq_len}, overlong={config.overlong!r}; the run could never make a "
                      f"batch:\n{report.summary()}")
    if report.seen >= min(probed, config.skip_check_min_records) and report.skip_rate > config.max_skip_rate:
        raise VtError(f"probe of the first {probed} records: skip rate {100 * report.skip_rate:.1f}% is above "
                      f"max_skip_rate {100 * config.max_skip_rate:.1f}%:\n{report.summary()}")
    return report


class SftDataset:
    """The pipeline as a grain IterDataset; ``iter()`` gives a checkpointable grain DatasetIterator."""

    def __init__(self, iter_dataset: grain.IterDataset, *, config: PipelineConfig, num_records: int,
                 probe: SkipReport, plan: ShardPlan | None = None):
        self.iter_dataset = iter_dataset
        self.config = config
        self.num_records = num_records  # this process's share (its logical shards), one epoch
        self.probe = probe
        self.plan = plan

    def __iter__(self) -> grain.DatasetIterator:
        return iter(self.iter_dataset)


def build_sft_dataset(source, tokenizer: Tokenizer, config: PipelineConfig, *, process_index: int = 0,
                      process_count: int = 1) -> SftDataset:
    """Build the packed, batched SFT pipeline over ``source`` (see the module docstring)."""
    plan = _validate(config, process_index, process_count)
    if len(source) == 0:
        raise VtError(f"{source!r}: the data source is empty")
    tokenize = _Tokenize(tokenizer, config)
    s_total, r = plan.num_shards, plan.rows_per_shard
    # Shard before anything else so each process touches only its own records.
    records = {}
    for s in plan.owned:
        ds = grain.MapDataset.source(source)[s::s_total]
        if len(ds) == 0:
            where = f"process {process_index} of {process_count}" if config.num_shards is None else \
                f"logical data shard {s} of {s_total} (process {process_index} of {process_count})"
            raise VtError(f"{where} has no records ({len(source)} in total); use fewer shards (num_shards)")
        if config.shuffle:  # a fresh permutation each epoch: shuffle(seed + epoch) under repeat
            ds = ds.shuffle(seed=shard_seed(config.seed, s))
        records[s] = ds
    num_records = sum(len(ds) for ds in records.values())
    probed = [{} for _ in records]
    probe = _probe([ds.map(tokenize) for ds in records.values()], min(config.probe_records, num_records), config,
                   probed)
    # The threads are shared out over the shards; each shard may run as far ahead as the whole pipeline would
    # with one shard, so shards not being consumed keep tokenising while another one is packed.
    threads = -(-config.read_threads // len(plan.owned)) if config.read_threads > 0 else 0
    read = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=max(config.read_threads * 8, 1)) \
        if threads > 0 else grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    shards = {}
    for (s, ds), done in zip(records.items(), probed):
        it = ds.repeat(config.num_epochs).map_with_index(_TokenizeOnce(tokenize, done)).to_iter_dataset(read)
        it = _CountSkipsIterDataset(it, pad_id=tokenizer.pad_token_id, max_skip_rate=config.max_skip_rate,
                                    min_records=config.skip_check_min_records)
        it = pack_first_fit(it, seq_len=config.seq_len, num_packing_bins=config.num_packing_bins or r,
                            pad_id=tokenizer.pad_token_id, seed=shard_seed(config.seed, s), shuffle_bins=config.shuffle)
        # The last batch of a finite run is topped up with empty rows (segment 0, no loss) rather than dropped,
        # so no example is lost and every batch has the same static shape (no recompilation).
        shards[s] = it.batch(r, drop_remainder=False, batch_fn=_StackAndPad(r, config.seq_len, tokenizer.pad_token_id))
    it = LogicalShardsIterDataset(shards, num_shards=s_total, micro_batches=config.grad_accum_steps,
                                  empty_rows=lambda: _empty_rows(r, config.seq_len, tokenizer.pad_token_id))
    return SftDataset(it, config=config, num_records=num_records, probe=probe, plan=plan)


def count_tokens(batch: dict[str, np.ndarray]) -> dict[str, int]:
    """Per-batch token accounting for metrics: real tokens, loss tokens, padding, documents."""
    seg = np.asarray(batch["segment_ids"])
    docs = int(sum(len(np.unique(r[r > 0])) for r in seg.reshape(-1, seg.shape[-1])))
    return {"tokens": int((seg > 0).sum()), "loss_tokens": int(np.asarray(batch["loss_mask"]).sum()),
            "padding": int((seg == 0).sum()), "documents": docs}

