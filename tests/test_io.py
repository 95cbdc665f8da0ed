"""vt.io: whole-file writes appear whole or leave the old file, JSONL round-trips numpy values, bad lines are named."""
import json
import os
import stat

import numpy as np
import pytest

from vt import VtError
from vt.io import ResumableWriter, append_lines, atomic_write_json, read_rows, write_jsonl


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise RuntimeError("scorer died")

    with pytest.raises(RuntimeError, match="scorer died"):
        write_jsonl(out, rows())
    assert out.read_text() == '{"a": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]
    # mkstemp's 0600 is not kept: the file has the permissions of a normally created one
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_jsonl_round_trip_keeps_unicode_and_converts_numpy(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"text": "é 数", "n": np.int64(3), "x": np.float32(0.5),
                                              "ids": np.arange(3)}])
    assert "é 数" in path.read_text(encoding="utf-8")
    assert list(read_rows(path)) == [(f"{path}:1", {"text": "é 数", "n": 3, "x": 0.5, "ids": [0, 1, 2]})]
    report = atomic_write_json(tmp_path / "report.json", {"path": tmp_path, "count": np.int32(2)})
    assert json.loads(report.read_text()) == {"path": str(tmp_path), "count": 2}


def test_bad_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(VtError, match=r"bad\.jsonl:3: expected a JSON object, got list"):
        list(read_rows(path))


# --- vt.io.exclusive: one writer per workdir or output (issue 23 item 3) ---------------------------------------

def test_a_second_holder_is_refused_naming_the_first_ones_pid(tmp_path):
    from vt.io import LOCK_FILE, exclusive
    work = tmp_path / "work"
    with exclusive(work, "--workdir", inside=True) as lock:
        assert lock == work / LOCK_FILE and lock.read_text() == f"{os.getpid()}\n"
        # flock belongs to the open file, so a second open in this same process conflicts like another process
        with pytest.raises(VtError, match=rf"^--workdir {work}: in use by another vt process \(pid {os.getpid()}, "):
            with exclusive(work, "--workdir", inside=True):
                pass
        assert lock.read_text() == f"{os.getpid()}\n"  # the refused one changed nothing
    assert not (work / LOCK_FILE).exists()  # released and removed
    with exclusive(work, "--workdir", inside=True):  # free again
        pass


def test_an_output_that_appears_by_rename_is_locked_beside_it(tmp_path):
    from vt.io import exclusive
    out = tmp_path / "merged"
    with exclusive(out, "output", inside=False) as lock:
        assert lock.parent == tmp_path and not out.exists()
        with pytest.raises(VtError, match="in use by another vt process"):
            with exclusive(out, "output", inside=False):
                pass
    assert sorted(tmp_path.iterdir()) == []


def test_the_kernel_releases_the_lock_of_a_killed_holder(tmp_path):
    import signal
    import subprocess
    import sys
    from vt.io import LOCK_FILE, exclusive
    work = tmp_path / "work"
    code = ("import sys, time; from vt.io import exclusive\n"
            "with exclusive(sys.argv[1], 'w', inside=True):\n    print('held', flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(work)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(VtError, match=rf"pid {p.pid}\b"):
            with exclusive(work, "w", inside=True):
                pass
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert (work / LOCK_FILE).exists()  # kill -9 ran no clean-up, yet the lock is free
    with exclusive(work, "w", inside=True) as lock:
        assert lock.read_text() == f"{os.getpid()}\n"


def test_every_writer_encodes_a_lone_surrogate(tmp_path):
    """A lone surrogate anywhere in a record (a key, a value, nested) is written as U+FFFD by every JSON writer, so
    one record can never stop a file; the files read back (read_rows refuses lone surrogates, so none is left)."""
    row = {"bad\ud800": ["x\udfff", {"y": "\ud83d alone"}], "ok": "é😀"}
    want = {"bad\ufffd": ["x\ufffd", {"y": "\ufffd alone"}], "ok": "é😀"}
    write_jsonl(tmp_path / "w.jsonl", [row])
    atomic_write_json(tmp_path / "a.json", row)
    with open(tmp_path / "l.jsonl", "w", encoding="utf-8") as f:
        append_lines(f, [row])
    w = ResumableWriter(tmp_path / "r.jsonl")
    w.write(0, [row], reason="odd\ud800", detail="\udc80", where="w")
    w.close()
    for name in ("w.jsonl", "l.jsonl", "r.jsonl"):
        assert [r for _, r in read_rows(tmp_path / name)] == [want], name
    assert json.loads((tmp_path / "a.json").read_bytes().decode("utf-8")) == want
    assert "\ufffd" in (tmp_path / "r.jsonl.rejected.jsonl").read_bytes().decode("utf-8")
