"""Helpers for the learner tests (not a conftest.py: tests/conftest.py is imported as `conftest`)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest



@pytest.fixture(scope="module")
def tiny_setup():
    import jax
    from vt.checkpoint.params import flat_params
    from vt.model import create_model, preset
    from vt.sharding import MeshConfig, make_mesh
    from vt.train.state import ModelDef
    cfg = preset("tiny")
    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    return cfg, mesh, ModelDef(cfg), flat_params(create_model(cfg, mesh, seed=0))


def random_batch(rng: np.random.Generator, A: int, B: int, T: int, vocab: int = 512) -> dict[str, np.ndarray]:
    """Packed rows of random documents (2-3 per row) with assistant-like masks and trailing padding."""
    out = {k: np.zeros((A, B, T), np.int32) for k in ("input_ids", "targets", "segment_ids", "positions")}
    out["loss_mask"] = np.zeros((A, B, T), np.float32)
    for a in range(A):
        for b in range(B):
            t = 0
            for seg in range(1, 4):
                L = int(rng.integers(3, T // 3))
                if t + L > T - 2:
                    break
                toks = rng.integers(4, vocab, L + 1)
                out["input_ids"][a, b, t:t + L] = toks[:-1]
                out["targets"][a, b, t:t + L] = toks[1:]
                out["segment_ids"][a, b, t:t + L] = seg
                out["positions"][a, b, t:t + L] = np.arange(L)
                out["loss_mask"][a, b, t + L // 2:t + L - 1] = 1.0
                t += L
    return out
