"""`vt demo --fresh` deletes only what vt created (a marker it wrote), after validation, never under --validate."""
import pytest

from vt import VtError
from vt.checkpoint.io import CREATED_MARKER, claim_dir, remove_created_dir
from vt.cli import main


def _unrelated(tmp_path):
    d = tmp_path / "mine"
    (d / "sub").mkdir(parents=True)
    (d / "thesis.tex").write_text("years of work")
    (d / "sub" / "data.csv").write_text("1,2,3")
    return d


def _intact(d):
    return (d / "thesis.tex").read_text() == "years of work" and (d / "sub" / "data.csv").is_file()


@pytest.mark.parametrize("extra", [["--validate"], ["--variant", "nosuch"], ["--only", "nosuchstage"],
                                   ["--until", "nosuchstage"], ["--from", "rl_code", "--until", "rl_math"],
                                   ["--validate", "--variant", "nosuch"]])
def test_demo_fresh_never_deletes_before_validation_or_under_validate(tmp_path, capsys, extra):
    d = _unrelated(tmp_path)
    rc = main(["demo", "--fresh", "--workdir", str(d), *extra])
    assert _intact(d)
    assert rc in (0, 1, 2) and ("--validate" in extra or rc == 2)


def test_fresh_refuses_a_directory_vt_did_not_create(tmp_path):
    d = _unrelated(tmp_path)
    with pytest.raises(VtError, match=rf"--fresh: {d} was not created by vt \(it holds no {CREATED_MARKER}\)"):
        remove_created_dir(d, "--fresh")
    assert _intact(d)
    claim_dir(d, "vt pipeline")  # a directory holding other files is not adopted
    assert not (d / CREATED_MARKER).exists()
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(VtError, match="not created by vt"):
        remove_created_dir(f, "--fresh")
    assert f.read_text() == "x"


def test_fresh_deletes_what_vt_created(tmp_path):
    d = claim_dir(tmp_path / "demo_out", "vt pipeline")
    (d / "sft").mkdir()
    (d / "sft" / "manifest.json").write_text("{}")
    assert remove_created_dir(d, "--fresh") and not d.exists()
    assert remove_created_dir(d, "--fresh") is False  # nothing there: nothing to do
