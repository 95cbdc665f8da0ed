"""Filesystem helpers shared by every writer: outputs appear whole or not at all, and vt deletes only what it
created.

The rule for every destructive flag (`vt demo --fresh`, an overwrite): vt deletes a directory only when it holds
a marker vt wrote when it created it (CREATED_MARKER; a checkpoint's seal counts for a checkpoint), only after
the command's inputs were validated, and never under `--validate`. Anything else is an error naming the flag
and the path: a mistyped --workdir never costs a directory of unrelated files."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from vt import VtError
from vt.checkpoint.seal import is_sealed
from vt.distributed import barrier, is_primary, process_count
from vt.io import exclusive


CREATED_MARKER = ".vt-created"


def claim_dir(path: Path, by: str) -> Path:
    """Create `path` for `by` (a command), marking it as vt's when vt creates it or finds it empty; a directory
    that already holds other files stays unmarked, so no destructive flag will ever delete it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not (path / CREATED_MARKER).exists() and not any(path.iterdir()):
            (path / CREATED_MARKER).write_text(json.dumps({"created_by": by}) + "\n")
    except OSError as e:
        raise VtError(f"{path}: cannot create directory ({e.strerror})") from None
    return path


def remove_created_dir(path: Path, flag: str) -> bool:
    """Delete `path` for `flag` if vt created it (see the module doc); False if there was nothing to delete."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_symlink() or not path.is_dir() or not (path / CREATED_MARKER).is_file():
        raise VtError(f"{flag}: {path} was not created by vt (it holds no {CREATED_MARKER}); not deleting it "
                      "(choose another directory, or delete it yourself)")
    shutil.rmtree(path)
    return True


@contextlib.contextmanager
def atomic_output_dir(out_dir: Path | str, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `out_dir` to write into; rename it to `out_dir` on success, delete it on any
    error. An existing non-empty `out_dir` is refused unless overwrite=True, so nothing saved is ever lost. The
    output is locked while it is written (vt.io.exclusive, beside it): a second writer of the same `out_dir` is
    refused naming the first one's pid, where it would replace (or delete) the first one's output.

    Multi-process (jax.distributed): every process must enter with the same `out_dir`; they all get the same
    temporary directory (Orbax writes each process's shards into it), process 0 creates and renames it, and
    barriers keep the others from writing before it exists or returning before the rename. Plain files
    written inside should come from process 0 only (vt.distributed.is_primary)."""
    out_dir = Path(out_dir)
    with exclusive(out_dir, "output", inside=False, enabled=is_primary()):
        yield from _atomic_output_dir(out_dir, overwrite)


def _atomic_output_dir(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        if not overwrite:
            raise VtError(f"{out_dir}: already exists and is not empty; choose another output directory")
        if not (out_dir.is_dir() and (is_sealed(out_dir) or (out_dir / CREATED_MARKER).is_file())):
            raise VtError(f"{out_dir}: exists and is not a checkpoint vt wrote; not overwriting it")
    parent = out_dir.parent
    multi = process_count() > 1
    try:
        if not multi:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
            os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700; the output gets a plain mkdir's mode
        else:  # one name every process can compute: a random one would differ per process
            tmp = parent / f".{out_dir.name}.tmp-shared"
            if is_primary():
                parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed run
                tmp.mkdir()
    except OSError as e:
        raise VtError(f"{out_dir}: cannot create output directory ({e.strerror})") from None
    if multi:
        barrier(f"vt-atomic-open:{out_dir}")
    try:
        yield tmp
        if multi:
            barrier(f"vt-atomic-written:{out_dir}")
        if is_primary():
            if out_dir.exists():
                shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
            os.rename(tmp, out_dir)
        if multi:
            barrier(f"vt-atomic-renamed:{out_dir}")
    except BaseException:
        if is_primary():
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def umask() -> int:
    try:  # Linux: read it without setting it (os.umask sets and returns, racing other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def reader_error(e: BaseException) -> str:
    """One line for a reader's (Orbax/TensorStore) exception: the innermost cause, which names the file and the
    fault ("OUT_OF_RANGE: Error reading ... Requested byte range ..."), without the pybind11 reprs and spec dumps
    the outer wrappers carry; at most 300 characters."""
    seen, inner = set(), e
    while id(inner) not in seen and (inner.__cause__ or inner.__context__) is not None:
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    first = (str(inner).strip().splitlines() or [""])[0]
    first = re.split(r"\s*See full TensorStore details|\s*\[source locations=|\s*\[tensorstore_spec=|"
                     r"\s*<bound method pybind11", first)[0]
    return f"{type(inner).__name__}: {first[:300]}"
