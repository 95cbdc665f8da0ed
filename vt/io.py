"""Files in and out, for every command: atomic writes, JSONL and parquet rows, resumable JSONL outputs.

Whole-file outputs (``atomic_write_text``, ``atomic_write_json``, ``write_jsonl``) are written to a temporary
sibling and renamed over the target only when complete, so an error or a kill leaves an existing file untouched
and never a half-written one. ``read_rows(path)`` yields ``(where, row)`` with ``where`` = ``file:LINE`` /
``file:row N``, every field kept (vt.data.sources normalises; this does not); a malformed JSON line raises
VtError naming it. ``ResumableWriter`` appends JSONL lines with a journal so a killed run continues exactly where
it stopped (see its docstring); a ``.parquet`` output is assembled from the finished JSONL at the end.
``exclusive(target, name)`` holds the one lock that keeps two vt processes from writing the same workdir or
output at once.

This module sits at the bottom of vt's imports (it needs only vt.validation), so any package may use it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vt import VtError
from vt.validation import parse_json_line


LOCK_FILE = ".vt.lock"


def lock_path(target: Path | str, *, inside: bool) -> Path:
    """Where the lock of `target` lives: inside a directory written in place (a training workdir, `vt eval
    --out`); beside an output that appears by rename when it is complete (a checkpoint directory, a file), which
    cannot hold the lock while it is written (and a file inside a sealed checkpoint would break its seal)."""
    target = Path(target)
    return target / LOCK_FILE if inside else target.parent / f".{target.name}{LOCK_FILE}"


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


@contextlib.contextmanager
def exclusive(target: Path | str, name: str, *, inside: bool, enabled: bool = True) -> Iterator[Path]:
    """Hold an exclusive lock on `target` (a workdir or an output; `name` says which, e.g. "--workdir") for the
    block, or raise VtError naming the pid of the process that holds it. fcntl.flock on `lock_path(target)`:
    the kernel releases it when the process ends however it ends (kill -9 included), so a lock is never stale;
    the file holds the holder's pid for that message and is removed when the block ends. `enabled=False`
    (processes other than the first of a multi-process run, which share the first's lock) only yields.

    A lock file is removed on release, so a process that opened it just before may lock a name that is gone: it
    then starts over with the file now at that path (the inode check below)."""
    path = lock_path(target, inside=inside)
    if not enabled:
        yield path
        return
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise VtError(f"{name} {target}: cannot create its lock {path} ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise VtError(f"{name} {target}: cannot lock {path} ({e.strerror})") from None
            raise VtError(f"{name} {target}: in use by another vt process ({_holder(path)}, lock {path}); wait for "
                          "it to finish or stop it") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        # Unlink while still holding the lock, then release: a process that opens the name after this sees a new
        # file (or none) and locks that.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
# A full file system, however the writer reports it: OSError from Python, ValueError "RESOURCE_EXHAUSTED ... [OS
# error 28]" from Orbax/tensorstore (a page of text), SafetensorError. Each errno with the texts that carry it.
_OUT_OF_SPACE = {errno.ENOSPC: ("No space left on device", "os error 28", "OS error 28", "os_error_code='28'"),
                 errno.EDQUOT: ("Disk quota exceeded", "os_error_code='122'"),
                 errno.EFBIG: ("File too large", "os_error_code='27'")}


def out_of_space_reason(e: BaseException | None) -> str | None:
    """"No space left on device" (or the quota's, or the file size limit's reason) when ``e`` is the file system
    running out of space or an error it caused (its __cause__ chain); else None."""
    while e is not None:
        for code, texts in _OUT_OF_SPACE.items():
            if (isinstance(e, OSError) and e.errno == code) or any(t in str(e) for t in texts):
                return os.strerror(code)
        e = e.__cause__
    return None


def out_of_space(e: BaseException | None) -> bool:
    return out_of_space_reason(e) is not None


def error_detail(e: BaseException) -> str:
    """An OSError's file and reason, else the first line of the message (writers' messages run to pages)."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename is not None else e.strerror
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


class OutOfSpace(VtError):
    """The disk (or quota) refused a write: one line naming what could not be written."""


@contextlib.contextmanager
def writing(what: str) -> Iterator[None]:
    """Writes inside the block that fail for want of space raise OutOfSpace naming `what` (buffered writers report
    the failure without a file name, and Orbax's reports run to pages)."""
    try:
        yield
    except OutOfSpace:
        raise
    except Exception as e:
        reason = out_of_space_reason(e)
        if reason is not None:
            raise OutOfSpace(f"out of disk space: cannot write {what} ({reason})") from e
        raise


def call_all(fns: Iterable[Callable[[], Any]]) -> None:
    """Call each of `fns` (closing what a run opened), then raise the first error any of them raised: one failing
    (a full disk) neither stops the others nor hides behind a later one's error."""
    error = None
    for fn in fns:
        try:
            fn()
        except Exception as e:
            error = error or e
    if error is not None:
        raise error


def plain(x: Any) -> Any:
    """numpy / pyarrow leftovers -> JSON-serialisable Python."""
    if isinstance(x, np.ndarray):
        return [plain(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def _numpy_to_json(x: Any) -> Any:
    """json.dumps' `default`: called only for values json cannot write, so plain rows pay nothing for it."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


# A lone surrogate ("\ud800") is a valid Python str and valid JSON, but not Unicode: it cannot be encoded as UTF-8,
# and one in any record (a verifier's message quoting a program's exception, a model's text) would stop the whole
# file being written. Every writer here replaces them with U+FFFD; text without one only pays for one regex scan.
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so that it encodes as UTF-8."""
    return _SURROGATE.sub("\ufffd", text)


def dumps(obj: Any) -> str:
    """One JSONL line's text (no newline): UTF-8 kept as is (lone surrogates as U+FFFD), numpy values as Python
    ones."""
    return encodable(json.dumps(obj, ensure_ascii=False, default=_numpy_to_json))


@contextlib.contextmanager
def atomic_writer(path: Path | str) -> Iterator[IO[str]]:
    """A text file to write `path` through: a temporary sibling, renamed over `path` when the block ends without
    error and deleted otherwise. The file gets the permissions of a normally created one (mkstemp makes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path | str, text: str) -> Path:
    with atomic_writer(path) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: Path | str, obj: Any, *, indent: int = 2) -> Path:
    """A JSON document (a manifest, a report); values json cannot write (paths, numpy scalars) as their str."""
    return atomic_write_text(path, encodable(json.dumps(plain(obj), indent=indent, ensure_ascii=False, default=str))
                             + "\n")


def write_jsonl(path: Path | str, rows: Iterable[dict]) -> Path:
    """One JSON object per line, written atomically; `rows` may be a generator that computes them as it goes (an
    exception from it leaves `path` as it was)."""
    with atomic_writer(path) as f:
        for row in rows:
            f.write(dumps(row) + "\n")
    return Path(path)


def read_rows(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    path = str(path)
    if not os.path.isfile(path):
        raise VtError(f"{path}: no such file")
    if path.endswith(".parquet"):
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow's error types vary by cause
            raise VtError(f"{path}: cannot read parquet: {e}") from e
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}:row {i}", plain(row)
        return
    if not path.endswith(".jsonl"):
        raise VtError(f"{path}: unknown format (expected .jsonl or .parquet)")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            obj = parse_json_line(raw, f"{path}:{lineno}")  # names bad UTF-8, JSON or lone surrogates
            if not isinstance(obj, dict):
                raise VtError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield f"{path}:{lineno}", obj


def count_rows(path: str | os.PathLike) -> int:
    path = str(path)
    if path.endswith(".parquet"):
        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def read_complete_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file this process appends to; a torn last line (killed mid-write) is cut off the
    file. A bad line anywhere else is corruption: VtError naming it."""
    if not path.exists():
        return []
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
    rows = []
    for lineno, raw in enumerate(data[:keep].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rows.append(json.loads(raw))
        except json.JSONDecodeError as e:
            raise VtError(f"{path}:{lineno}: corrupt line ({e}); delete the file to start over") from None
    return rows


def append_lines(f, objs: list[dict]) -> None:
    if objs:
        f.write("".join(dumps(o) + "\n" for o in objs))
    f.flush()
    os.fsync(f.fileno())


class ResumableWriter:
    """Output JSONL plus a journal: one journal line per consumed input row ``{"i": row, "out": k,
    "reason": r}`` written *after* that row's k output lines.

    On open, the journal says which input rows are done and how many output lines they own; output lines
    past that count (a row killed half-written) are cut, so resuming never duplicates or loses a line.
    Rejected rows go to ``<out>.rejected.jsonl`` with their reason (the "what was removed and why").
    A ``.parquet`` output path is written through ``<out>.partial.jsonl`` and converted by ``finish()``.
    """

    def __init__(self, out_path: str | os.PathLike):
        self.final = Path(out_path)
        if self.final.suffix not in (".jsonl", ".parquet"):
            raise VtError(f"{self.final}: output must be .jsonl or .parquet")
        if self.final.suffix == ".parquet" and self.final.exists():
            raise VtError(f"{self.final}: already exists (finished); choose another output")
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.path = self.final if self.final.suffix == ".jsonl" else Path(str(self.final) + ".partial.jsonl")
        self.journal_path = Path(str(self.final) + ".journal")
        self.rejected_path = Path(str(self.final) + ".rejected.jsonl")
        journal = read_complete_jsonl(self.journal_path)
        if self.path.exists() and not self.journal_path.exists():
            raise VtError(f"{self.path}: exists without its journal {self.journal_path.name}; "
                          "not written by this command (delete it or choose another output)")
        self.done = {int(j["i"]) for j in journal}
        self.counts: dict[str, int] = {}
        for j in journal:
            self.counts[j["reason"]] = self.counts.get(j["reason"], 0) + 1
        owned = sum(int(j["out"]) for j in journal)
        self.kept_rows = self._cut(self.path, owned)
        self._cut(self.rejected_path, sum(1 for j in journal if j["reason"] != "kept"))
        self._out = open(self.path, "a", encoding="utf-8")
        self._rej = open(self.rejected_path, "a", encoding="utf-8")
        self._jr = open(self.journal_path, "a", encoding="utf-8")

    @staticmethod
    def _cut(path: Path, n: int) -> list[dict]:
        rows = read_complete_jsonl(path)
        if len(rows) < n:
            raise VtError(f"{path}: has {len(rows)} lines but its journal accounts for {n}; the output was "
                          "edited or truncated (delete it and its journal to start over)")
        if len(rows) > n:
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(dumps(r) + "\n" for r in rows[:n]))
        return rows[:n]

    def write(self, i: int, outputs: list[dict], reason: str = "kept", detail: Any = None,
              where: str = "") -> None:
        """Record input row ``i``: its output rows (kept) or its rejection ``reason`` (+ detail)."""
        append_lines(self._out, outputs)
        if reason != "kept":
            append_lines(self._rej, [{"where": where, "reason": reason, "detail": detail}])
        append_lines(self._jr, [{"i": i, "out": len(outputs), "reason": reason}])
        self.done.add(i)
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def close(self) -> None:
        for f in (self._out, self._rej, self._jr):
            f.close()

    def finish(self, report: dict) -> dict:
        """Close, convert to parquet if asked, write ``<out>.report.json``; returns the report."""
        self.close()
        if self.final.suffix == ".parquet":
            rows = read_complete_jsonl(self.path)
            pq.write_table(pa.Table.from_pylist(rows), self.final)
            self.path.unlink()
        report = {**report, "counts": dict(sorted(self.counts.items())), "output": str(self.final),
                  "rejected": str(self.rejected_path)}
        atomic_write_json(Path(str(self.final) + ".report.json"), report)
        return report
