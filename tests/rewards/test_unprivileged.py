"""The code sandbox's attack suites again, as an ordinary user (issue 46).

Most people train as a normal user, not root: then there is no per-slot sandbox uid, no cgroup, and the
sandbox's processes (bwrap's init included) have the trainer's own uid. The suites below run in a child
pytest under an unprivileged uid (``setpriv --reuid``). The interpreter and the venv must be readable by that
uid: where one of their directories (or the checkout's) sits under a directory only root may enter (a pyenv
Python under /root), the child runs in a private mount namespace where that directory is an empty tmpfs
holding only what the run needs, bound in from the real one; nothing on the host changes.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/rewards/test_code_isolation.py", "tests/rewards/test_code_sandbox.py", "tests/rewards/test_code_pool.py"]
UID = 64_321  # no account of the host's: nothing it owns but the scratch home made here
CHILD_TIMEOUT_S = 1200


def _blocked_ancestors(paths: list[Path]) -> list[Path]:
    """Directories on the way to ``paths`` that another uid may not enter, outermost first."""
    blocked = set()
    for path in paths:
        for d in [*reversed(path.parents), path]:
            try:
                if not os.stat(d).st_mode & stat.S_IXOTH:
                    blocked.add(d)
            except OSError:
                pass
    return sorted(blocked, key=lambda d: len(d.parts))


def _mount_script(needed: list[Path], staging: Path) -> str:
    """Shell lines (for ``unshare --mount``) that make each blocked ancestor an empty tmpfs (mode 755) with the
    needed entries bound back in from the real directory, staged first at ``staging``."""
    lines = ["set -e"]
    for i, d in enumerate(_blocked_ancestors(needed)):
        keep = sorted({p.relative_to(d).parts[0] for p in needed if d in p.parents})
        if not keep:
            continue
        orig = staging / f"orig{i}"
        lines += [f"mkdir -p '{orig}'", f"mount --bind '{d}' '{orig}'", f"mount -t tmpfs -o mode=755 tmpfs '{d}'"]
        for name in keep:
            src = orig / name
            lines.append(f"if [ -d '{src}' ]; then mkdir -p '{d / name}'; else touch '{d / name}'; fi")
            lines.append(f"mount --bind '{src}' '{d / name}'")
    return "\n".join(lines)


def test_the_attack_suites_hold_for_an_ordinary_user(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("this run is already unprivileged: the suites themselves are the check")
    for tool in ("setpriv", "unshare", "bwrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (make test installs util-linux and bubblewrap)")
    needed = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), ROOT]
    home = Path(tempfile.mkdtemp(prefix="vt-unprivileged-home-"))  # pytest's own tmp_path is root's alone
    os.chown(home, UID, UID)
    staging = tmp_path / "staging"
    staging.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LD_LIBRARY_PATH": str(Path(sys.base_prefix).resolve() / "lib"),  # a pyenv Python's libpython
    }
    child = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *SUITES]
    script = "\n".join([
        _mount_script(needed, staging),
        f"cd '{ROOT}'",
        'exec setpriv --reuid="$0" --regid="$0" --clear-groups -- "$@"',
    ])
    try:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(UID), *child],
            env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=str(ROOT),
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, tail
