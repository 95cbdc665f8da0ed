"""Logit and greedy-token parity with transformers' Qwen2ForCausalLM and Qwen3ForCausalLM (the reference
implementations), on the random models of `hf_dir` (tests/conftest.py: both architectures, tied and untied, Qwen3's
of other widths and head counts, head_dim != hidden / heads)."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from vt.checkpoint.params import load_model

FP32_TOL = 1e-5  # max-abs logit difference, float32 (issue 2)


def _batch(vocab, lengths, seed=0):
    """Right-padded random sequences of different lengths + their masks."""
    rng = np.random.RandomState(seed)
    T = max(lengths)
    tokens = rng.randint(0, vocab, (len(lengths), T))
    mask = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    return np.where(mask, tokens, 0), mask


def _hf_logits(hf_model, tokens, mask):
    with torch.no_grad():
        return hf_model(torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64))).logits.float().numpy()


def _vt_logits(model, tokens, mask):
    logits, _ = model(jnp.asarray(tokens, jnp.int32), segment_ids_BT=jnp.asarray(mask, jnp.int32))
    return np.asarray(logits)


def test_fp32_logits_match_transformers(hf_dir, vt_ckpt):
    from transformers import AutoModelForCausalLM
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    model = load_model(vt_ckpt)
    tokens, mask = _batch(hf_model.config.vocab_size, [17, 5, 12, 1])
    ref, ours = _hf_logits(hf_model, tokens, mask), _vt_logits(model, tokens, mask)
    assert ours.shape == ref.shape
    err = np.abs(ours - ref)[mask].max()
    assert err < FP32_TOL, err


def test_bf16_compute_error_no_worse_than_transformers_bf16(hf_dir, vt_ckpt):
    """bf16 tolerance, stated relative to the reference's own bf16 error: vt with fp32 params + bf16 compute
    must stay within 2x the error of transformers run entirely in bf16, and within 5% of the logit range."""
    from transformers import AutoModelForCausalLM
    hf32 = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    hf16 = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).eval()
    model = load_model(vt_ckpt, dtype="bfloat16")
    tokens, mask = _batch(hf32.config.vocab_size, [16, 9, 13], seed=1)
    ref = _hf_logits(hf32, tokens, mask)
    hf_err = np.abs(_hf_logits(hf16, tokens, mask) - ref)[mask].max()
    vt_err = np.abs(_vt_logits(model, tokens, mask) - ref)[mask].max()
    assert vt_err <= 2 * hf_err, (vt_err, hf_err)
    assert vt_err <= 0.05 * np.abs(ref).max(), (vt_err, np.abs(ref).max())


def test_packed_documents_equal_separate(vt_ckpt):
    """Two documents packed in one row with segment ids give the logits each has on its own."""
    model = load_model(vt_ckpt)
    rng = np.random.RandomState(3)
    a, b = rng.randint(0, 300, 7), rng.randint(0, 300, 10)
    packed = np.concatenate([a, b, [0, 0, 0]])[None]
    segments = np.array([[1] * 7 + [2] * 10 + [0] * 3])
    positions = np.array([list(range(7)) + list(range(10)) + [0, 0, 0]])
    logits, _ = model(jnp.asarray(packed), jnp.asarray(positions), jnp.asarray(segments))
    alone_a, _ = model(jnp.asarray(a[None]))
    alone_b, _ = model(jnp.asarray(b[None]))
    np.testing.assert_allclose(np.asarray(logits[0, :7]), np.asarray(alone_a[0]), atol=FP32_TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(logits[0, 7:17]), np.asarray(alone_b[0]), atol=FP32_TOL, rtol=0)


@pytest.mark.parametrize("impl", ["jax"])
def test_attention_implementations_agree(vt_ckpt, impl):
    """`jax.nn.dot_product_attention` (cuDNN flash on NVIDIA GPUs) matches the XLA einsum path."""
    ref_model, model = load_model(vt_ckpt), load_model(vt_ckpt, attention_impl=impl)
    tokens, mask = _batch(300, [11, 6])
    np.testing.assert_allclose(_vt_logits(model, tokens, mask)[mask], _vt_logits(ref_model, tokens, mask)[mask],
                               atol=FP32_TOL, rtol=0)


def test_kv_cache_decode_matches_full_forward(vt_ckpt):
    """Prefill then one-token decode steps give the logits of a full forward over the prefix."""
    from vt.model.kv_pages import PagedKVCache
    model = load_model(vt_ckpt)
    rng = np.random.RandomState(4)
    seq = rng.randint(0, 300, (2, 12))
    full, _ = model(jnp.asarray(seq))
    cache = PagedKVCache.for_rows(model.cfg, batch=2, length=16, page_size=4)
    logits, cache = model(jnp.asarray(seq[:, :6]), cache=cache)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full[:, :6]), atol=FP32_TOL, rtol=0)
    for t in range(6, 12):
        pos = jnp.full((2, 1), t, jnp.int32)
        logits, cache = model(jnp.asarray(seq[:, t:t + 1]), positions_BT=pos, cache=cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), np.asarray(full[:, t]), atol=FP32_TOL, rtol=0)


def test_greedy_generation_through_the_sampler_matches_transformers(hf_dir, vt_ckpt):
    """vt's engine decodes what transformers' greedy `generate` does, token for token: pages of 4 tokens (every
    sample crosses page boundaries), 2 samples a prompt sharing its full pages, 3 slots for 8 samples (refill)."""
    from transformers import AutoModelForCausalLM
    from vt.sampling.config import Request, SamplerConfig
    from vt.sampling.engine import Engine
    rng = np.random.RandomState(5)
    prompts = [rng.randint(0, 300, n).tolist() for n in (5, 13, 1, 9)]
    engine = Engine(load_model(vt_ckpt), SamplerConfig(batch_size=3, temperature=0.0, stop_token_ids=(), n=2,
                                                        page_size=4, kv_pages=40))
    out = engine.generate([Request(p, max_new_tokens=24) for p in prompts], seed=0)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    for p, samples in zip(prompts, out):
        with torch.no_grad():
            ids = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0)
        assert [s.completion_ids for s in samples] == [ids[0, len(p):].tolist()] * 2
