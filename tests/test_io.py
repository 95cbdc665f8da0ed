"""vt.io: whole-file writes appear whole or leave the old file, JSONL round-trips numpy values, bad lines are named."""
import json
import os
import stat

import numpy as np
import pytest

from vt import VtError
from vt.io import atomic_write_json, read_rows, write_jsonl


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
