"""Fixtures of the sampling tests: one tiny random transformers Qwen2 (untied, so the LM-head path of the
prefill is covered; the tied path is covered by the `tiny` preset) converted with the real CLI."""
from pathlib import Path

import pytest

from testutil import make_hf_model, run_vt


@pytest.fixture(scope="session")
def sampling_hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sampling_hf")
    make_hf_model(tie=False, seed=1).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def sampling_ckpt(sampling_hf_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sampling_ckpt") / "ck"
    run_vt("convert", "hf-to-orbax", str(sampling_hf_dir), str(out), check=True)
    return out


@pytest.fixture(scope="session")
def sampling_model(sampling_ckpt):
    from vt.checkpoint.params import load_model
    return load_model(sampling_ckpt)
