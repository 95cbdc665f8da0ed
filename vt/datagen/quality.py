"""Row-level quality control: n-gram filters, exact / near-duplicate removal, decontamination.

Each is a ``process(i, where, row) -> (outputs, reason, detail)`` step driven by vt.datagen.stages.run_stage,
which makes it resumable and writes the per-reason report.

Filters (on the response of a chat record, else its prompt; words as vt.data.filters normalises them):
  - ``repetition``: ``repetition_score(text, n)`` above ``max_repetition`` (looping traces);
  - ``templated``: the same score after every digit run is replaced by 0, with a shorter n: catches
    degeneration that cycles one template with changing numbers ("Try x = 1 ... Try x = 2 ...");
  - ``too_short`` / ``too_long`` (characters), ``no_response`` when a response is required.
Duplicates: ``exact_duplicate`` (same normalised words) and ``near_duplicate`` (MinHash LSH, datasketch,
over word shingles; Jaccard estimate >= threshold), keeping the first occurrence.
Decontamination: ``contaminated`` when the row shares a word n-gram (13 by default) with an evaluation
text (vt.data.filters.NgramDecontaminator); the detail names the eval item and the n-gram.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from typing import Annotated

from vt import VtError
from vt.data.filters import NgramDecontaminator, ngrams, repetition_score, words
from vt.data.sources import Malformed, record_from_dict
from vt.io import read_rows
from vt.validation import AT_LEAST_1, FRACTION, NON_NEGATIVE, FieldError, check_fields, check_value


def row_record(row: dict, where: str, i: int):
    rec = record_from_dict(row, where=where, default_id=str(i))
    return rec


def texts_of(rec, part: str) -> str:
    """``prompt``: all prompt contents; ``response``: the last assistant turn ("" if none); ``all``: both."""
    prompt = "\n".join(m["content"] for m in rec.prompt)
    response = rec.response or ""
    return {"prompt": prompt, "response": response, "all": prompt + "\n" + response}[part]


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    repetition_n: Annotated[int, AT_LEAST_1] = 10
    max_repetition: Annotated[float, FRACTION] = 0.5
    template_n: Annotated[int, AT_LEAST_1] = 6
    max_template: Annotated[float, FRACTION] = 0.7
    min_chars: Annotated[int, NON_NEGATIVE] = 1
    max_chars: Annotated[int, NON_NEGATIVE] = 0  # 0 = no limit
    require_response: bool = False

    def __post_init__(self):
        check_fields(self)
        if self.max_chars and self.min_chars > self.max_chars:
            raise FieldError(type(self).__name__, "max_chars", f"must be 0 (no limit) or >= min_chars "
                             f"({self.min_chars}), got {self.max_chars}: every row would be dropped")


def templated_score(text: str, n: int) -> float:
    return repetition_score(re.sub(r"\d+", "0", text), n)


def filter_step(cfg: FilterConfig):
    def process(i, where, row):
        rec = row_record(row, where, i)
        if isinstance(rec, Malformed):
            return [], f"malformed:{rec.reason}", rec.detail
        if cfg.require_response and rec.response is None:
            return [], "no_response", None
        text = rec.response if rec.response is not None else texts_of(rec, "prompt")
        if len(text) < cfg.min_chars:
            return [], "too_short", len(text)
        if cfg.max_chars and len(text) > cfg.max_chars:
            return [], "too_long", len(text)
        rep = repetition_score(text, cfg.repetition_n)
        if rep > cfg.max_repetition:
            return [], "repetition", round(rep, 4)
        tpl = templated_score(text, cfg.template_n)
        if tpl > cfg.max_template:
            return [], "templated", round(tpl, 4)
        return [row], "kept", None
    return process


@dataclasses.dataclass(frozen=True)
class DedupConfig:
    key: str = "all"  # prompt | response | all: which text must repeat to count as a duplicate
    near_threshold: Annotated[float, FRACTION] = 0.8  # Jaccard (MinHash estimate) at or above which rows are near-duplicates; 0 = exact only
    num_perm: Annotated[int, AT_LEAST_1] = 128
    shingle: Annotated[int, AT_LEAST_1] = 5  # words per shingle

    def __post_init__(self):
        check_fields(self)


class Deduplicator:
    """First occurrence wins. ``seen(row)`` after ``add(row)`` rebuilds the index on resume."""

    def __init__(self, cfg: DedupConfig):
        if cfg.key not in ("prompt", "response", "all"):
            raise VtError(f"dedup key {cfg.key!r}: expected prompt, response or all")
        self.cfg = cfg
        self.exact: dict[str, str] = {}
        self.lsh = None
        if cfg.near_threshold > 0:
            try:
                from datasketch import MinHashLSH
            except ImportError as e:
                raise VtError("near-duplicate removal needs the 'datasketch' package (pip install datasketch), "
                              "or pass --near-threshold 0 for exact duplicates only") from e
            self.lsh = MinHashLSH(threshold=cfg.near_threshold, num_perm=cfg.num_perm)
            self.hashes: dict[str, object] = {}

    def _minhash(self, w: list[str]):
        from datasketch import MinHash
        m = MinHash(num_perm=self.cfg.num_perm)
        grams = ngrams(w, self.cfg.shingle) or [tuple(w)]
        m.update_batch([" ".join(g).encode() for g in grams])
        return m

    def check(self, key: str, text: str) -> tuple[str, object]:
        """("kept", None) and index it, or (reason, detail) for a duplicate of an earlier row."""
        w = words(text)
        digest = hashlib.sha1(" ".join(w).encode()).hexdigest()
        if digest in self.exact:
            return "exact_duplicate", {"of": self.exact[digest]}
        mh = None
        if self.lsh is not None:
            mh = self._minhash(w)
            best = None
            for other in self.lsh.query(mh):
                j = mh.jaccard(self.hashes[other])
                if j >= self.cfg.near_threshold and (best is None or j > best[1]):
                    best = (other, j)
            if best is not None:
                return "near_duplicate", {"of": best[0], "jaccard": round(best[1], 4)}
        self.exact[digest] = key
        if mh is not None and key not in self.hashes:
            self.lsh.insert(key, mh)
            self.hashes[key] = mh
        return "kept", None


def dedup_step(cfg: DedupConfig, kept_rows: Sequence[dict]):
    dd = Deduplicator(cfg)
    for j, row in enumerate(kept_rows):  # resume: the kept output is exactly the index's content
        rec = row_record(row, "", j)
        if not isinstance(rec, Malformed):
            dd.check(f"{rec.id}#{j}", texts_of(rec, cfg.key))
    state = {"n": len(kept_rows)}

    def process(i, where, row):
        rec = row_record(row, where, i)
        if isinstance(rec, Malformed):
            return [], f"malformed:{rec.reason}", rec.detail
        reason, detail = dd.check(f"{rec.id}#{state['n']}", texts_of(rec, cfg.key))
        if reason != "kept":
            return [], reason, detail
        state["n"] += 1
        return [row], "kept", None
    return process


def eval_texts(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(``file:id``, question text) of every evaluation item: prompt contents (and a ``problem`` field)."""
    out = []
    for p in paths:
        for i, (where, row) in enumerate(read_rows(p)):
            rec = record_from_dict(row, where=where, default_id=str(i))
            if isinstance(rec, Malformed):
                raise VtError(str(rec))
            out.append((f"{p}:{rec.id}", "\n".join(m["content"] for m in rec.prompt if m["role"] != "system")))
    if not out:
        raise VtError(f"decontamination: no evaluation texts in {list(paths)}")
    return out


class Decontaminator:
    """NgramDecontaminator plus attribution of each hit to the eval item it came from."""

    def __init__(self, items: list[tuple[str, str]], n: int = 13, min_short_words: int = 6):
        check_value(n, AT_LEAST_1, "decontamination n-gram length")  # 0 would match every row
        self.items, self.n, self.min_short = items, n, min_short_words
        self.index = NgramDecontaminator([t for _, t in items], n=n, min_short_words=min_short_words)
        self._grams = None

    def owner(self, gram: tuple[str, ...]) -> str:
        if self._grams is None:  # built on the first hit only
            self._grams = []
            for name, t in self.items:
                w = words(t)
                self._grams.append((name, set(ngrams(w, self.n)) if len(w) >= self.n else {tuple(w)}))
        return next((name for name, g in self._grams if gram in g), "?")

    def check(self, text: str):
        hits = self.index.matches(text)
        if not hits:
            return None
        return {"eval_item": self.owner(hits[0]), "ngram": " ".join(hits[0]), "hits": len(hits)}


def decontam_step(deco: Decontaminator, part: str = "all"):
    def process(i, where, row):
        rec = row_record(row, where, i)
        if isinstance(rec, Malformed):
            return [], f"malformed:{rec.reason}", rec.detail
        hit = deco.check(texts_of(rec, part))
        return ([], "contaminated", hit) if hit else ([row], "kept", None)
    return process
