"""Curriculum manifests for SFT stages 1 and 2 from verified traces (`vt data stratify`).

Cells are vt.data.curriculum.stratify's (difficulty bucket, trace-length bucket); difficulty is
``metadata.difficulty``, else ``1 - metadata.pass_rate``. Written into OUT_DIR:

    stage1.jsonl      every record, ordered by cell (easy and short first; input order inside a cell)
    stage2.jsonl      the hard subset (RECIPE): trace >= min_trace_tokens and error rate >= min_error_rate
    pass_rates.jsonl  {"id": prompt_id, "pass_rate", "n"} per prompt: the profiling file that
                      configs/sft_stage2.py's data.hard_subset.pass_rates reads (vt.data.curriculum)
    manifest.json     edges, cell counts and the stage-2 selection report

Idempotent: outputs are written to temporary files and renamed, so a killed run is simply run again.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Sequence

from vt import VtError
from vt.data.curriculum import (PassRate, bucket_of, default_difficulty, select_hard_subset, stratify,
                                token_trace_length)
from vt.data.sources import ListSource, Malformed, record_from_dict
from vt.data.tokenizer import load_tokenizer
from vt.io import atomic_write_json, read_rows, write_jsonl
from vt.validation import AT_LEAST_1, FRACTION, NON_NEGATIVE, check_fields


@dataclasses.dataclass(frozen=True)
class StratifyConfig:
    difficulty_edges: tuple[float, ...] = (0.25, 0.5, 0.75)
    length_edges: tuple[int, ...] = (1024, 5000, 16384)
    min_trace_tokens: Annotated[int, NON_NEGATIVE] = 5000  # RECIPE stage 2: traces of at least 5K tokens
    min_error_rate: Annotated[float, FRACTION] = 0.75  # RECIPE stage 2: reference errs in >= 75% of rollouts
    min_rollouts: Annotated[int, AT_LEAST_1] = 8  # RECIPE profiles with 8 rollouts; rates from fewer are not trusted
    tokenizer: str = ""  # for traces without metadata.trace_length

    def __post_init__(self):
        check_fields(self)


def pass_rate_table(rows: Sequence[dict], records) -> list[dict]:
    """One profiling line per prompt id; traces of one prompt must agree on pass_rate and rollouts."""
    table: dict[str, dict] = {}
    for row, rec in zip(rows, records):
        md = rec.metadata
        if md.get("pass_rate") is None:
            continue
        n = md.get("rollouts", md.get("n"))
        if n is None:
            raise VtError(f"{rec.where}: metadata.pass_rate without metadata.rollouts (how many samples?)")
        entry = {"id": rec.prompt_id, "pass_rate": float(md["pass_rate"]), "n": int(n)}
        old = table.setdefault(rec.prompt_id, entry)
        if old != entry:
            raise VtError(f"{rec.where}: prompt {rec.prompt_id!r} has pass_rate/rollouts {entry['pass_rate']}/"
                          f"{entry['n']} here but {old['pass_rate']}/{old['n']} on an earlier trace")
    return list(table.values())


def run_stratify(inp: str, out_dir: str | Path, cfg: StratifyConfig) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, records = [], []
    for i, (where, row) in enumerate(read_rows(inp)):
        rec = record_from_dict(row, where=where, default_id=str(i))
        if isinstance(rec, Malformed):
            raise VtError(str(rec))
        rows.append(row)
        records.append(rec)
    tok = None
    if cfg.tokenizer:
        tok = load_tokenizer(cfg.tokenizer)
    base_length = token_trace_length(tok)

    def length(rec) -> int:
        if tok is None and "trace_length" not in rec.metadata:
            raise VtError(f"{rec.where}: no metadata.trace_length; pass --tokenizer to count trace tokens")
        return base_length(rec)

    source = ListSource(records)
    cells = stratify(source, difficulty_edges=cfg.difficulty_edges, length_edges=cfg.length_edges,
                     trace_length=length)
    order = [i for _, idx in cells.items() for i in idx]
    write_jsonl(out / "stage1.jsonl", (rows[i] for i in order))
    table = pass_rate_table(rows, records)
    write_jsonl(out / "pass_rates.jsonl", table)
    rates = {t["id"]: PassRate(t["pass_rate"], t["n"]) for t in table}
    hard, report = select_hard_subset(source, rates, trace_length=length, min_trace_tokens=cfg.min_trace_tokens,
                                      min_error_rate=cfg.min_error_rate, min_rollouts=cfg.min_rollouts,
                                      missing="exclude")
    write_jsonl(out / "stage2.jsonl", (rows[i] for i in hard))
    manifest = {
        "input": inp, "difficulty_edges": list(cfg.difficulty_edges), "length_edges": list(cfg.length_edges),
        "cells": [{"difficulty_bucket": d, "length_bucket": l, "count": len(idx)} for (d, l), idx in cells.items()],
        "stage1": len(order), "stage2": len(hard), "prompts_with_pass_rate": len(table),
        "stage2_report": dataclasses.asdict(report),
        "unknown_difficulty": sum(bucket_of(default_difficulty(r), cfg.difficulty_edges) == -1 for r in records),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
