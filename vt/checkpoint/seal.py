"""Checkpoint seals: the one home for writing and verifying the checksums of every checkpoint vt writes.

A seal is `vt_checksums.json` in the checkpoint directory: the sha256 of every file in it, written last (atomically)
once everything else is on disk. Every writer seals (the learners' step directories, `save_model`, so
`vt convert hf-to-orbax` and `vt merge`, and `vt convert orbax-to-hf`'s HF directories) and every reader verifies
(`load_model`, so `vt sample`, `vt eval`, `vt merge`, `vt convert orbax-to-hf`, a training resume, and `vt info`).

Verification is fast: the files are hashed by a few threads (hashlib releases the GIL) while the caller reads the
same files (Orbax restoring the arrays), so the bytes come from disk once and hashing overlaps the restore instead
of adding a second pass. `--trust-checkpoint` (set_verify(False)) skips it for storage that is trusted.

Orbax's own step bookkeeping at the top of a step directory (`_CHECKPOINT_METADATA`, `commit_success.txt`) is
rewritten by Orbax when it commits the step, after our seal, so it is not covered: the seal covers what a step
holds (params, optimiser state, RNG, data state, model_config.json), not when Orbax committed it.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from pathlib import Path

from vt import VtError
from vt.io import atomic_write_json

CHECKSUM_FILE = "vt_checksums.json"
_HASH_THREADS = min(8, os.cpu_count() or 1)
_verify = True


def set_verify(enabled: bool) -> None:
    """Turn checkpoint verification on or off for this process (`--trust-checkpoint` turns it off)."""
    global _verify
    _verify = bool(enabled)


def verify_enabled() -> bool:
    return _verify


def add_trust_flag(parser) -> None:
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="skip verifying checkpoint checksums (storage you trust; saves one hash of the files)")


def _covered(rel: str) -> bool:
    """Whether the seal covers the file at `rel` (posix path relative to the checkpoint directory)."""
    if rel.startswith(CHECKSUM_FILE):  # the seal itself and a temporary left by a kill while writing it
        return False
    if "/" not in rel and (rel.startswith("_") or rel.startswith("commit_success")):
        return False  # Orbax's step bookkeeping, rewritten when Orbax commits the step (see the module doc)
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def covered_files(directory: Path) -> list[str]:
    out = []
    for root, _, files in os.walk(directory):
        for name in files:
            rel = (Path(root) / name).relative_to(directory).as_posix()
            if _covered(rel):
                out.append(rel)
    return sorted(out)


def hash_tree(directory: Path) -> dict[str, str]:
    directory = Path(directory)
    files = covered_files(directory)
    # Largest first so one big shard does not start last and leave the other threads idle.
    order = sorted(files, key=lambda rel: -(directory / rel).stat().st_size)
    with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS) as pool:
        digests = dict(zip(order, pool.map(lambda rel: _sha256(directory / rel), order)))
    return {rel: digests[rel] for rel in files}


def is_sealed(directory: Path) -> bool:
    return (Path(directory) / CHECKSUM_FILE).is_file()


def sealed_steps(checkpoint_dir: Path | str) -> list[int]:
    """The steps, ascending, of a run's checkpoint directory (one `<step>/` each) whose writes completed: those
    with a seal. An unsealed step directory is a save a kill interrupted; a missing directory has none."""
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir()
                  if p.name.isascii() and p.name.isdigit() and p.is_dir() and is_sealed(p))


def write_seal(directory: Path, *, hashed: bool = True, **fields) -> None:
    """Seal `directory` (all its files must be written): the checksums file appears whole (vt.io) or not at all."""
    directory = Path(directory)
    record = {**fields, "algorithm": "sha256", "files": hash_tree(directory) if hashed else None}
    atomic_write_json(directory / CHECKSUM_FILE, record, indent=1)


def read_seal(directory: Path, label: str) -> dict:
    path = Path(directory) / CHECKSUM_FILE
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("files", {}), (dict, type(None))):
            raise ValueError("not a checksum record")
    except FileNotFoundError:
        raise VtError(f"{label} ({directory}): not sealed ({CHECKSUM_FILE} missing): the write did not complete, "
                      "or an older vt or another tool wrote it (--trust-checkpoint loads it unverified)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise VtError(f"{label}: {path} is corrupted ({e})") from None
    return record


def missing_files(directory: Path, record: dict) -> list[str]:
    """Files the seal lists that are gone (a cheap stat per file, no hashing)."""
    return sorted(rel for rel in (record.get("files") or {}) if not (Path(directory) / rel).is_file())


def _compare(directory: Path, record: dict, label: str, hint: str) -> None:
    want = record.get("files")
    if want is None:
        return  # sealed without checksums (checkpoint.checksum=False)
    got = hash_tree(directory)
    for rel in sorted(set(want) | set(got)):
        if want.get(rel) != got.get(rel):
            what = "missing" if rel not in got else "unexpected" if rel not in want else "checksum mismatch"
            raise VtError(f"{label} is corrupted: {Path(directory) / rel}: {what}" + (f" ({hint})" if hint else ""))


def verify_seal(directory: Path, label: str, *, hint: str = "", required: bool = True) -> None:
    """Raise VtError naming `label` and the file when `directory` differs from its seal. Unsealed: an error when
    `required` (a vt checkpoint), else accepted (a Hugging Face directory from elsewhere carries no seal)."""
    if not _verify or (not required and not is_sealed(directory)):
        return
    _compare(Path(directory), read_seal(directory, label), label, hint)


class BackgroundVerify:
    """verify_seal run in a thread while the caller reads the same files; result() re-raises its error.

    Use as `with BackgroundVerify(d, label) as v: restore(...)`: a restore that fails on a damaged file reports
    the seal's message (the file and 'checksum mismatch') rather than the reader's internal one."""

    def __init__(self, directory: Path, label: str, *, hint: str = "", required: bool = True):
        self._args = (Path(directory), label)
        self._kw = dict(hint=hint, required=required)
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._future = self._pool.submit(verify_seal, *self._args, **self._kw) if _verify else None

    def result(self) -> None:
        try:
            if self._future is not None:
                self._future.result()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.result()
            return False
        # The read failed: if the seal explains why (a damaged file), that is the error to show.
        self.result()  # raises the seal's VtError, chained to the reader's exception
        return False
