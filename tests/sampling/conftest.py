"""Fixtures of the sampling tests: one tiny random transformers Qwen2 (untied, so the LM-head path of the
prefill is covered; the tied path is covered by the `tiny` preset) converted with the real CLI."""
from pathlib import Path

import pytest

from testutil import build_once, make_hf_model, run_vt


@pytest.fixture(scope="session")
def sampling_hf_dir(shared_dir) -> Path:
    return build_once("sampling_hf", lambda d: make_hf_model(tie=False, seed=1).save_pretrained(d))


@pytest.fixture(scope="session")
def sampling_ckpt(sampling_hf_dir) -> Path:
    def convert(d: Path) -> None:
        run_vt("convert", "hf-to-orbax", str(sampling_hf_dir), str(d / "ck"), check=True)
    return build_once("sampling_ckpt", convert) / "ck"


@pytest.fixture(scope="session")
def sampling_model(sampling_ckpt):
    from vt.checkpoint.params import load_model
    return load_model(sampling_ckpt)
