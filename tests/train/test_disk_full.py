"""Issue 23 item 2: a full disk during `vt train` stops the run with one line and exit 2, the newest sealed step
intact, and SIGTERM is honoured before and after the disk fills (it used to hang: tensorboardX's writer thread
died on ENOSPC and its bounded queue then blocked the loop, deaf to SIGTERM, until kill -9).

The disks are small tmpfs mounts (real ENOSPC from the kernel, for every writer and thread; root only)."""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testutil import REPO, fill_disk, small_tmpfs
from vt import EXIT_PREEMPTED, VtError
from vt.io import OutOfSpace, call_all, out_of_space_reason, writing


# --- the pieces, in-process ------------------------------------------------------------------------------------------

def test_out_of_space_is_recognised_however_the_writer_reports_it():
    enospc = os.strerror(errno.ENOSPC)
    assert out_of_space_reason(OSError(errno.ENOSPC, enospc)) == enospc
    assert out_of_space_reason(OSError(errno.EDQUOT, "quota")) == os.strerror(errno.EDQUOT)
    tensorstore = ValueError('RESOURCE_EXHAUSTED: Error writing "embed/0.0" in OCDBT database ...: Failed to write '
                             "85672 bytes to file 8: No space left on device [os_error_code='28']")
    assert out_of_space_reason(tensorstore) == enospc
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = tensorstore
    assert out_of_space_reason(wrapped) == enospc
    assert out_of_space_reason(OSError(errno.EACCES, "Permission denied")) is None
    assert out_of_space_reason(ValueError("step 28 of 30")) is None


def test_writing_names_what_could_not_be_written_and_call_all_runs_everything():
    with pytest.raises(OutOfSpace, match=r"^out of disk space: cannot write /w/metrics.jsonl \(No space left"):
        with writing("/w/metrics.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(PermissionError):  # anything else passes through as it was
        with writing("x"):
            raise PermissionError(errno.EACCES, "denied")
    ran = []
    with pytest.raises(VtError, match="first"):
        call_all([lambda: ran.append(1), lambda: (_ for _ in ()).throw(VtError("first")), lambda: ran.append(3),
                  lambda: (_ for _ in ()).throw(VtError("second"))])
    assert ran == [1, 3]


# --- `vt train` on a disk that fills ---------------------------------------------------------------------------------

# What a 5 MiB disk refuses first: the second checkpoint (Orbax's thread fails, the loop sees it after the step),
# or, should the loop write its next metrics line before it looks, that line (the file's last page is full).
FAILED = r"(checkpoint step 4 \(\S+/checkpoints/4\)|\S+/metrics\.jsonl|\S+/tb/events\.out\.tfevents\S+)"


def _train(workdir: Path, **env) -> subprocess.Popen:
    """A tiny SFT run that saves every 2 steps, keeps 1, and would run for hours."""
    cmd = [sys.executable, "-m", "vt", "train", "--config", "configs/sft_stage1.py:smoke", "--workdir", str(workdir),
           "--config.train.steps=100000", "--config.checkpoint.every=2", "--config.checkpoint.keep=1",
           "--config.train.progress=False", "--config.train.eval_every=0"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", **env})


def _wait_for(cond, p: subprocess.Popen, what: str, timeout: float = 600) -> None:
    """Start-up (JAX, compiling the step) takes most of a minute on a loaded 2-core machine."""
    end = time.time() + timeout
    while not cond():
        if p.poll() is not None or time.time() > end:
            p.kill()
            raise AssertionError(f"{what} never happened (rc {p.poll()}):\n{p.communicate()[1][-3000:]}")
        time.sleep(0.02)


def _one_line(p: subprocess.Popen, rc: int) -> str:
    """Waits for the run to end (a hang is a failure, not a slow pass), then: exit `rc`, one line on stderr."""
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"still running 30 s after the disk filled:\n{p.communicate()[1][-3000:]}") from None
    lines = [line for line in err.splitlines() if line.strip()]
    assert p.returncode == rc and len(lines) == 1 and "Traceback" not in err, f"rc {p.returncode}:\n{err}"
    return lines[0]


def _sealed(ck: Path) -> list[int]:
    from vt.checkpoint.seal import sealed_steps
    return sealed_steps(ck)


def _newest_step_intact(ck: Path) -> int:
    """The newest sealed step verifies and loads; no other step directory (a failed save) counts as one."""
    from vt.checkpoint.params import load_model
    from vt.checkpoint.seal import verify_seal
    steps = _sealed(ck)
    assert steps, "no sealed step left"
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == steps  # no unsealed step dir
    verify_seal(ck / str(steps[-1]), "newest step")
    load_model(ck / str(steps[-1]))  # vt's reader (verifies the seal again while reading)
    return steps[-1]


@pytest.mark.slow
def test_full_disk_in_train_stops_with_one_line_and_sigterm_is_honoured_before_and_after(tmp_path):
    """Three runs at once (each start costs most of a minute of CPU here):
    full:   a 5 MiB disk holds one checkpoint; saving the next fails in Orbax's background thread -> exit 2;
    before: a SIGTERM, then the disk fills before the run sees the SIGTERM (the process is stopped meanwhile)
            -> the preemption's exit status, the line naming the disk;
    after:  the disk fills, then a SIGTERM while the run is stopping (held there by VT_TEST_HOLD_AT) -> ends at
            once with the preemption's exit status."""
    with small_tmpfs(tmp_path / "full", "5m") as full, small_tmpfs(tmp_path / "before", "24m") as before, \
            small_tmpfs(tmp_path / "after", "5m") as after:
        hold = tmp_path / "held"
        runs = {"full": _train(full / "w"), "before": _train(before / "w"),
                "after": _train(after / "w", VT_TEST_HOLD_AT="stopping", VT_TEST_HOLD_FILE=str(hold))}

        p = runs["before"]
        _wait_for(lambda: _sealed(before / "w" / "checkpoints"), p, "a sealed step")
        p.send_signal(signal.SIGSTOP)
        try:
            fill_disk(before)
            p.send_signal(signal.SIGTERM)  # pending until the process continues: before it can see the full disk
        finally:
            p.send_signal(signal.SIGCONT)
        line = _one_line(p, EXIT_PREEMPTED)
        assert line.startswith("vt train: error: SIGTERM, then out of disk space: cannot write "), line
        _newest_step_intact(before / "w" / "checkpoints")

        p = runs["after"]
        _wait_for(hold.exists, p, "stopping after the full disk")
        p.send_signal(signal.SIGTERM)
        line = _one_line(p, EXIT_PREEMPTED)
        assert re.fullmatch(rf"vt train: error: out of disk space: cannot write {FAILED} \(No space left on device\); "
                            r"SIGTERM: stopped without waiting for saves in flight \(.*\)", line), line
        assert _newest_step_intact(after / "w" / "checkpoints") == 2

        p = runs["full"]
        _wait_for(lambda: p.poll() is not None or _sealed(full / "w" / "checkpoints"), p, "a sealed step")
        line = _one_line(p, 2)
        ck = full / "w" / "checkpoints"
        assert re.fullmatch(rf"vt train: error: out of disk space: cannot write {FAILED} \(No space left on device\); "
                            r"the newest sealed checkpoint is step 2 \(free space and re-run to resume from it\)",
                            line), line
        assert _newest_step_intact(ck) == 2
