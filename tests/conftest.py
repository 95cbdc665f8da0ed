"""Session fixtures shared by every test folder; the helpers behind them live in testutil.py."""
from pathlib import Path

import pytest

from testutil import make_hf_model, run_vt


@pytest.fixture(scope="session", params=[True, False], ids=["tied", "untied"])
def hf_dir(request, tmp_path_factory) -> Path:
    """An HF directory (save_pretrained) of a tiny random Qwen2, tied and untied."""
    path = tmp_path_factory.mktemp(f"hf_{request.param}")
    make_hf_model(tie=request.param).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def vt_ckpt(hf_dir, tmp_path_factory) -> Path:
    """`hf_dir` converted with the real CLI."""
    out = tmp_path_factory.mktemp("ckpt") / "ck"
    run_vt("convert", "hf-to-orbax", str(hf_dir), str(out), check=True)
    return out


# Property tests draw the same examples on every run of the suite (CI must not turn red by luck); pass
# `--hypothesis-profile=explore` to search with fresh random examples, and pin what it finds with @example.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None)
_hypothesis_settings.register_profile("explore", max_examples=500)
_hypothesis_settings.load_profile("ci")
