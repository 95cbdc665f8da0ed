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
    error. An existing non-empty `out_dir` is refused unless overwrite=True, so nothing saved is ever lost."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise VtError(f"{out_dir}: already exists and is not empty; choose another output directory")
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    except OSError as e:
        raise VtError(f"{out_dir}: cannot create output directory ({e.strerror})") from None
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
