"""Data sources: chat JSONL, verl/rllm parquet, ArrayRecord and TFDS, all as random-access record lists.

Every source is a grain-compatible random-access data source (``__len__`` + ``__getitem__``) whose items
are either a :class:`Record` or a :class:`Malformed` marker. A bad line never raises inside the pipeline
and is never dropped silently: it travels as ``Malformed(reason, where, detail)`` to the counting stage
(:mod:`vt.data.dataset`), which tallies it per reason and names ``file:line`` in its report.

Accepted record shapes (JSON object per JSONL line / ArrayRecord record / parquet row / TFDS example)::

    {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}], ...}
        (an assistant turn may carry "tool_calls": [{"function": {"name": ..., "arguments": {...}}}], its content
        then possibly empty, answered by "tool" turns: SFT trains on the assistant turns, calls included)
    {"prompt": "question" | [messages], "response": "answer", ...}
    {"prompt": [messages], "reward_model": {"ground_truth": ...}, "ability": ..., "extra_info": ...}  (verl)
    {"input_ids": [...], "loss_mask": [...]}                     (pre-tokenised; loss_mask per token)
    {"question_content": ..., "public_test_cases": ...}          (LiveCodeBench; MBPP: "text" + "test_list")

Optional fields: ``id``, ``domain`` (else ``ability``, else the source's default), ``ground_truth`` (else
``reward_model.ground_truth``, else ``answer``), and ``difficulty``, ``pass_rate``, ``trace_length``,
``prompt_id`` at top level or inside ``metadata``.

Source specs for :func:`open_source`: ``path.jsonl``, ``path.parquet``, ``path.array_record`` (or
``arrayrecord:path``), globs of those, ``tfds:NAME[/CONFIG]:SPLIT`` (optionally ``@DATA_DIR`` suffix), and a
list/tuple or comma-separated string of specs (concatenated in order).
"""
from __future__ import annotations

import bisect
import dataclasses
import glob as _glob
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from vt import VtError
from vt.validation import JsonError, load_json

ROLES = ("system", "user", "assistant", "tool")
METADATA_KEYS = ("difficulty", "pass_rate", "trace_length", "prompt_id")
# Verifier references other than ground_truth, kept in metadata for vt.rewards: unit tests (code: vt's
# `tests`, HumanEval's `test` + `entry_point`, MBPP's `test_list` + `test_setup_code`, LiveCodeBench's
# test cases and `func_name`), instruction constraints (instruct: vt's `constraints`, IFEval's
# `instruction_id_list` + `kwargs`), rubric names (rubric). vt.rewards reads each shape as it comes.
REFERENCE_KEYS = ("tests", "constraints", "rubric", "test", "entry_point", "test_list", "test_setup_code",
                  "public_test_cases", "private_test_cases", "func_name", "instruction_id_list", "kwargs")

# Reasons a record can be rejected; the pipeline counts every skip under exactly one of these.
MALFORMED_JSON = "malformed_json"
INVALID_UTF8 = "invalid_utf8"
MISSING_FIELD = "missing_field"
BAD_MESSAGE = "bad_message"
EMPTY_RESPONSE = "empty_response"


@dataclasses.dataclass(frozen=True)
class Record:
    """One training/eval example.

    ``messages``: the chat (role/content dicts, roles in :data:`ROLES`). A prompt-only record (RL, eval)
    has no assistant message. ``input_ids``/``loss_mask``: set instead of ``messages`` for pre-tokenised
    data. ``metadata``: optional ``difficulty``, ``pass_rate``, ``trace_length``, ``prompt_id`` (several
    traces of one query share a ``prompt_id``; defaults to ``id``) plus whatever else the source carried.
    ``where``: ``file:line`` (or ``file:row N``) for error messages.
    """

    id: str
    domain: str = "unknown"
    messages: tuple[dict, ...] = ()
    ground_truth: Any = None
    metadata: dict = dataclasses.field(default_factory=dict)
    input_ids: tuple[int, ...] | None = None
    loss_mask: tuple[int, ...] | None = None
    where: str = ""

    @property
    def prompt(self) -> tuple[dict, ...]:
        """Messages before the last assistant turn (all of them for a prompt-only record)."""
        last = self._last_assistant()
        return self.messages if last is None else self.messages[:last]

    @property
    def response(self) -> str | None:
        """Content of the last assistant turn, or None."""
        last = self._last_assistant()
        return None if last is None else self.messages[last]["content"]

    @property
    def prompt_id(self) -> str:
        return str(self.metadata.get("prompt_id", self.id))

    def _last_assistant(self) -> int | None:
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i]["role"] == "assistant":
                return i
        return None


@dataclasses.dataclass(frozen=True)
class Malformed:
    """A rejected record, counted by the pipeline under ``reason``: unreadable at the source, or (as
    vt.data.chat.Skip, the same class) rejected at tokenisation."""

    reason: str
    where: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}: {self.detail}"


# ---- parsing one JSON object into a Record ------------------------------------------------------------------
def _plain(x):
    """numpy / pyarrow leftovers -> plain Python (parquet gives numpy arrays for lists)."""
    if isinstance(x, np.ndarray):
        return [_plain(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, bytes):
        return x.decode("utf-8")  # UnicodeDecodeError is turned into invalid_utf8 by the caller
    return x


def _messages(value, where: str, field: str) -> tuple[dict, ...] | Malformed:
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        return Malformed(BAD_MESSAGE, where, f"'{field}' must be a string or a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            return Malformed(BAD_MESSAGE, where, f"'{field}[{i}]' needs 'role' and 'content'")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            return Malformed(BAD_MESSAGE, where, f"'{field}[{i}]': unknown role {role!r} (expected one of {ROLES})")
        if not isinstance(content, str):
            return Malformed(BAD_MESSAGE, where, f"'{field}[{i}]': content must be a string")
        out.append({"role": role, "content": content})
        if "tool_calls" in m and role == "assistant":
            calls = _tool_calls(m["tool_calls"])
            if calls is None:
                return Malformed(BAD_MESSAGE, where, f"'{field}[{i}].tool_calls' must be a list of "
                                 "{\"function\": {\"name\": str, \"arguments\": object}} (or name/arguments)")
            out[-1]["tool_calls"] = calls
    return tuple(out)


def _tool_calls(value) -> list[dict] | None:
    """An assistant turn's tool calls (OpenAI's / Qwen's chat format), as the chat templates read them, or None
    when malformed. The template renders them: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for c in value:
        f = c.get("function", c) if isinstance(c, dict) else None
        if not (isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("arguments"), dict)):
            return None
        out.append({"type": "function", "function": {"name": f["name"], "arguments": f["arguments"]}})
    return out


def record_from_dict(obj: Any, *, where: str, default_id: str, default_domain: str = "unknown") -> Record | Malformed:
    """Normalise one JSON-like object (see the module docstring) into a :class:`Record`."""
    try:
        obj = _plain(obj)
    except UnicodeDecodeError as e:
        return Malformed(INVALID_UTF8, where, str(e))
    if not isinstance(obj, dict):
        return Malformed(MALFORMED_JSON, where, f"expected a JSON object, got {type(obj).__name__}")
    meta_in = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    if isinstance(obj.get("metadata"), str):  # LiveCodeBench: metadata as a JSON string ({"func_name": ...})
        try:
            meta_in = json.loads(obj["metadata"])
        except json.JSONDecodeError:
            meta_in = {}
        meta_in = meta_in if isinstance(meta_in, dict) else {}
    extra = obj.get("extra_info") if isinstance(obj.get("extra_info"), dict) else {}
    metadata = dict(meta_in)
    for k in METADATA_KEYS + REFERENCE_KEYS:
        if k in obj:
            metadata[k] = obj[k]
    if extra:
        metadata["extra_info"] = extra
    if obj.get("data_source"):
        metadata["data_source"] = obj["data_source"]
    rid = obj.get("id", extra.get("index", default_id))
    domain = obj.get("domain") or obj.get("ability") or default_domain
    reward_model = obj.get("reward_model") if isinstance(obj.get("reward_model"), dict) else {}
    ground_truth = obj.get("ground_truth", reward_model.get("ground_truth", obj.get("answer")))
    common = dict(id=str(rid), domain=str(domain), ground_truth=ground_truth, metadata=metadata, where=where)

    if "input_ids" in obj:
        ids, mask = obj["input_ids"], obj.get("loss_mask")
        if mask is None:
            # Pre-tokenised data must say which tokens carry loss: training on everything by default would
            # silently train on prompts.
            return Malformed(MISSING_FIELD, where, "'input_ids' given without 'loss_mask'")
        if not (isinstance(ids, list) and isinstance(mask, list) and all(isinstance(i, int) for i in ids)
                and all(m in (0, 1) for m in mask)):
            return Malformed(MISSING_FIELD, where, "'input_ids' must be a list of ints, 'loss_mask' of 0/1")
        if len(ids) != len(mask):
            return Malformed(MISSING_FIELD, where, f"'input_ids' has {len(ids)} tokens, 'loss_mask' {len(mask)}")
        if not any(mask):
            return Malformed(EMPTY_RESPONSE, where, "'loss_mask' is all zeros")
        return Record(input_ids=tuple(ids), loss_mask=tuple(mask), **common)

    if "messages" in obj:
        msgs = _messages(obj["messages"], where, "messages")
    elif "prompt" in obj:
        msgs = _messages(obj["prompt"], where, "prompt")
        if not isinstance(msgs, Malformed) and "response" in obj:
            if not isinstance(obj["response"], str):
                return Malformed(MISSING_FIELD, where, "'response' must be a string")
            msgs = msgs + ({"role": "assistant", "content": obj["response"]},)
    elif "question_content" in obj and "public_test_cases" in obj:  # LiveCodeBench's question
        msgs = _messages(obj["question_content"], where, "question_content")
    elif "text" in obj and "test_list" in obj:  # MBPP's question
        msgs = _messages(obj["text"], where, "text")
    else:
        return Malformed(MISSING_FIELD, where, "no 'messages', 'prompt' or 'input_ids' field")
    if isinstance(msgs, Malformed):
        return msgs
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and not m["content"].strip() and not m.get("tool_calls"):
            return Malformed(EMPTY_RESPONSE, where, f"assistant message {i} is empty")
    return Record(messages=msgs, **common)


# ---- sources ---------------------------------------------------------------------------------------------
class ListSource:
    """In-memory records (tests, curriculum subsets of small sets)."""

    def __init__(self, records: Sequence[Record | Malformed]):
        self._records = list(records)

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i: int) -> Record | Malformed:
        return self._records[i]

    def __repr__(self) -> str:
        return f"ListSource({len(self)} records)"


class JsonlSource:
    """A JSONL file, one record per non-blank line, read lazily by byte offset (random access).

    The constructor scans the file once for line offsets (blank lines are not records and are not indexed);
    nothing else is held in memory. Items carry ``where = "path:LINE"`` (1-based).
    """

    def __init__(self, path: str | os.PathLike, default_domain: str = "unknown"):
        self.path = str(path)
        self.default_domain = default_domain
        if not os.path.isfile(self.path):
            raise VtError(f"{self.path}: no such file")
        offsets, lines = [], []
        with open(self.path, "rb") as f:
            pos = 0
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    offsets.append(pos)
                    lines.append(lineno)
                pos += len(line)
        self._offsets = np.asarray(offsets + [pos], dtype=np.int64)
        self._lines = np.asarray(lines, dtype=np.int64)
        self._stem = Path(self.path).stem

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, i: int) -> Record | Malformed:
        i = int(i)
        lineno = int(self._lines[i])
        where = f"{self.path}:{lineno}"
        # Open per read: thread-safe under grain's reader threads and picklable for worker processes.
        with open(self.path, "rb") as f:
            f.seek(int(self._offsets[i]))
            raw = f.readline()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return Malformed(INVALID_UTF8, where, str(e))
        try:
            obj = load_json(text)  # bare NaN, too-deep nesting: malformed too (vt.validation)
        except JsonError as e:
            return Malformed(MALFORMED_JSON, where, str(e))
        return record_from_dict(obj, where=where, default_id=f"{self._stem}:{lineno}",
                                default_domain=self.default_domain)

    def __repr__(self) -> str:
        return f"JsonlSource({self.path!r}, {len(self)} records)"


class ParquetSource:
    """A verl/rllm-style parquet file (``prompt`` = list of messages, ``reward_model.ground_truth``,
    ``ability``, ``extra_info``, ``data_source``) or any parquet with the JSONL fields as columns.

    Rows are materialised as Python objects at open (eval/RL prompt sets are small); for very large SFT
    sets prefer ArrayRecord.
    """

    def __init__(self, path: str | os.PathLike, default_domain: str = "unknown"):
        self.path = str(path)
        self.default_domain = default_domain
        if not os.path.isfile(self.path):
            raise VtError(f"{self.path}: no such file")
        try:
            self._rows = pq.read_table(self.path).to_pylist()
        except Exception as e:  # pyarrow raises ArrowInvalid/OSError variants on corrupt files
            raise VtError(f"{self.path}: cannot read parquet: {e}") from e
        self._stem = Path(self.path).stem

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> Record | Malformed:
        i = int(i)
        return record_from_dict(self._rows[i], where=f"{self.path}:row {i}", default_id=f"{self._stem}:{i}",
                                default_domain=self.default_domain)

    def __repr__(self) -> str:
        return f"ParquetSource({self.path!r}, {len(self)} records)"


class ArrayRecordSource:
    """ArrayRecord files whose records are UTF-8 JSON objects (see :func:`write_array_record`)."""

    def __init__(self, paths: Sequence[str | os.PathLike], default_domain: str = "unknown"):
        from grain.sources import ArrayRecordDataSource  # grain takes over a second to import: only when used

        self.paths = [str(p) for p in paths]
        self.default_domain = default_domain
        self._parts, starts, n = [], [], 0
        for p in self.paths:
            if not os.path.isfile(p):
                raise VtError(f"{p}: no such file")
            try:
                part = ArrayRecordDataSource([p])
                size = len(part)
            except Exception as e:
                raise VtError(f"{p}: cannot open ArrayRecord file: {e}") from e
            self._parts.append(part)
            starts.append(n)
            n += size
        self._starts, self._len = starts, n

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Record | Malformed:
        i = int(i)
        k = bisect.bisect_right(self._starts, i) - 1
        j = i - self._starts[k]
        where = f"{self.paths[k]}:record {j}"
        raw = self._parts[k][j]
        try:
            obj = load_json(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            return Malformed(INVALID_UTF8, where, str(e))
        except JsonError as e:
            return Malformed(MALFORMED_JSON, where, str(e))
        return record_from_dict(obj, where=where, default_id=f"{Path(self.paths[k]).stem}:{j}",
                                default_domain=self.default_domain)

    def __repr__(self) -> str:
        return f"ArrayRecordSource({self.paths!r}, {len(self)} records)"


def write_array_record(path: str | os.PathLike, objects: Sequence[dict | bytes]) -> None:
    """Write JSON objects (or raw bytes) as an ArrayRecord file readable by :class:`ArrayRecordSource`."""
    from array_record.python.array_record_module import ArrayRecordWriter

    # group_size:1 keeps random access cheap (one record per chunk); fine for SFT-sized records.
    writer = ArrayRecordWriter(str(path), "group_size:1")
    try:
        for obj in objects:
            writer.write(obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode("utf-8"))
    finally:
        writer.close()


def parse_tfds_spec(spec: str) -> tuple[str, str, str | None]:
    """``tfds:NAME[/CONFIG][:SPLIT][@DATA_DIR]`` -> (``NAME[/CONFIG]``, split, data_dir)."""
    body = spec[len("tfds:"):] if spec.startswith("tfds:") else spec
    data_dir = None
    if "@" in body:
        body, data_dir = body.split("@", 1)
    name, _, split = body.partition(":")
    if not name:
        raise VtError(f"{spec!r}: expected tfds:NAME[/CONFIG]:SPLIT")
    return name, split or "train", data_dir


class TfdsSource:
    """A TFDS dataset prepared locally, read through ``tfds.data_source`` (ArrayRecord backed, random access).

    Nothing is ever downloaded: the dataset must have been built (``tfds build NAME``) into ``data_dir``
    (default ``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``). Examples are converted with
    :func:`record_from_dict` (bytes fields decoded as UTF-8).
    """

    def __init__(self, spec: str, default_domain: str = "unknown"):
        self.spec = spec
        self.name, self.split, self.data_dir = parse_tfds_spec(spec)
        self.default_domain = default_domain
        try:
            import tensorflow_datasets as tfds
        except ImportError as e:
            raise VtError(f"{spec}: reading TFDS datasets needs the 'tensorflow-datasets' package "
                          "(pip install tensorflow-datasets; no tensorflow needed for data_source)") from e
        try:
            self._ds = tfds.data_source(self.name, split=self.split, data_dir=self.data_dir, download=False)
        except Exception as e:
            raise VtError(f"{spec}: cannot open TFDS dataset (prepared locally with `tfds build "
                          f"{self.name}`?): {e}") from e

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i: int) -> Record | Malformed:
        i = int(i)
        return record_from_dict(self._ds[i], where=f"{self.spec}:{i}", default_id=f"{self.name}:{self.split}:{i}",
                                default_domain=self.default_domain)


class ConcatSource:
    """Sources one after another (a mixture in file order; the pipeline shuffles)."""

    def __init__(self, sources: Sequence[Any]):
        self.sources = list(sources)
        self._starts = list(np.cumsum([0] + [len(s) for s in self.sources])[:-1])
        self._len = sum(len(s) for s in self.sources)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int):
        i = int(i)
        if not 0 <= i < self._len:
            raise IndexError(i)
        k = bisect.bisect_right(self._starts, i) - 1
        return self.sources[k][i - self._starts[k]]

    def __repr__(self) -> str:
        return f"ConcatSource({self.sources!r})"


class SubsetSource:
    """``source`` restricted to ``indices`` (curriculum stage-2 subsets, held-out splits)."""

    def __init__(self, source: Any, indices: Sequence[int]):
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.source[int(self.indices[int(i)])]


def open_source(spec: str | os.PathLike | Sequence[str], default_domain: str = "unknown"):
    """Open a source spec (see the module docstring) as a random-access source of Record | Malformed."""
    if isinstance(spec, (list, tuple)):
        parts = [open_source(s, default_domain) for s in spec]
        return parts[0] if len(parts) == 1 else ConcatSource(parts)
    spec = str(spec)
    if spec.startswith("tfds:"):
        return TfdsSource(spec, default_domain)
    if "," in spec and not os.path.exists(spec):
        return open_source([s.strip() for s in spec.split(",") if s.strip()], default_domain)
    if spec.startswith("arrayrecord:"):
        paths = sorted(_glob.glob(spec[len("arrayrecord:"):])) or [spec[len("arrayrecord:"):]]
        return ArrayRecordSource(paths, default_domain)
    paths = sorted(_glob.glob(spec)) if any(c in spec for c in "*?[") else [spec]
    if not paths:
        raise VtError(f"{spec}: no files match")
    sources = []
    for p in paths:
        if p.endswith(".jsonl"):
            sources.append(JsonlSource(p, default_domain))
        elif p.endswith(".parquet"):
            sources.append(ParquetSource(p, default_domain))
        elif ".array_record" in p or p.endswith(".arrayrecord"):
            sources.append(ArrayRecordSource([p], default_domain))
        else:
            raise VtError(f"{p}: unknown data format (expected .jsonl, .parquet, .array_record or tfds:NAME)")
    return sources[0] if len(sources) == 1 else ConcatSource(sources)
