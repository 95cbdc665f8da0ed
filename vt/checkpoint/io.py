"""Filesystem helpers shared by every writer: outputs appear whole or not at all."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from vt import VtError


@contextlib.contextmanager
def atomic_output_dir(out_dir: Path | str, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `out_dir` to write into; rename it to `out_dir` on success, delete it on any
    error. An existing non-empty `out_dir` is refused unless overwrite=True, so nothing saved is ever lost.

    Multi-process (jax.distributed): every process must enter with the same `out_dir`; they all get the same
    temporary directory (Orbax writes each process's shards into it), process 0 creates and renames it, and
    barriers keep the others from writing before it exists or returning before the rename. Plain files
    written inside should come from process 0 only (vt.distributed.is_primary)."""
    from vt.distributed import barrier, is_primary, process_count

    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise VtError(f"{out_dir}: already exists and is not empty; choose another output directory")
    parent = out_dir.parent
    multi = process_count() > 1
    try:
        if not multi:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
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
