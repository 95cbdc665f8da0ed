"""The rollout engine: cache parity, determinism, slot refill, n samples, stops, compile counts, weight updates."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vt import VtError
from vt.buckets import bucket
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.sampling.config import Request, SamplerConfig
from vt.sampling.engine import Engine
from vt.sampling import steps
from vt.sampling.rules import SamplingParams, sampling_logprobs
from vt.sharding import zeros_of


def _prompts(n, vocab, lo=2, hi=40, seed=0):
    rng = np.random.RandomState(seed)
    return [rng.randint(0, vocab, rng.randint(lo, hi)).tolist() for _ in range(n)]


def _ids(results):
    return [[s.completion_ids for s in samples] for samples in results]


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens):
    return nnx.merge(graphdef, state)(tokens)[0]


def _full_logits(model, seqs, width=64):
    """Logits of a full forward pass (no cache) over each sequence, right-padded to `width` (causal, so the
    padding cannot change earlier positions): [len(seqs), width, V]."""
    toks = np.zeros((len(seqs), width), np.int32)
    for i, seq in enumerate(seqs):
        toks[i, :len(seq)] = seq
    return np.asarray(_forward(*nnx.split(model), jnp.asarray(toks)))


@pytest.fixture(scope="module")
def tiny():
    return create_model(preset("tiny"), seed=3)  # tied embeddings


@functools.partial(jax.jit, static_argnums=0)
def _cached_step(graphdef, state, tok_B, pos_B, cache):
    return nnx.merge(graphdef, state)(tok_B[:, None], pos_B[:, None], cache=cache)


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_cache_parity_prefill_and_every_decode_step(which, tiny, sampling_model):
    """Prefill (right-padded, different lengths, written into shuffled pages of 4 tokens) and each decode step
    give the logits of a full forward pass over the whole prefix, through the engine's own prefill/insert
    path; prompt 0 is shared by two slots (its full pages shared, its partly filled last page copied)."""
    from vt.model.kv_pages import PagedKVCache
    model = tiny if which == "tied" else sampling_model
    cfg = model.cfg
    graphdef, state = nnx.split(model)
    prompts = _prompts(3, cfg.vocab_size, 3, 20, seed=1)
    prompts[0] = prompts[0][:9] + [1] * max(0, 9 - len(prompts[0]))  # 9 tokens: two full pages and one partial
    T, Z, M, B, steps_n, n_pages = 32, 4, 16, 5, 8, 60
    toks = np.zeros((4, T), np.int32)
    for p, ids in enumerate(prompts):
        toks[p, :len(ids)] = ids
    lens = np.array([len(p) for p in prompts] + [1], np.int32)
    perm = np.random.RandomState(0).permutation(n_pages)
    table = np.full((4, T // Z), n_pages, np.int32)
    used = 0
    for p, L in enumerate(lens[:3]):
        k = -(-L // Z)
        table[p, :k] = perm[used:used + k]
        used += k
    cache = dataclasses.replace(zeros_of(PagedKVCache.abstract(cfg, n_pages, Z, PagedKVCache.table_info(*table.shape))),
                                page_table=jnp.asarray(table))
    logits, cache = jax.jit(steps.prefill, static_argnums=0)(graphdef, state, cache, jnp.asarray(toks),
                                                              jnp.asarray(lens))
    dst = np.array([3, 2, 1, 4, B], np.int32)  # prompt p to slot 3 - p, prompt 0 also to slot 4; slot 0 empty
    src = np.array([0, 1, 2, 0, 3], np.int32)
    copy_dst = perm[used]  # slot 4 writes into its own copy of prompt 0's partial last page
    slot_pages = np.full((B, M), n_pages, np.int32)
    for q, (p, b) in enumerate(zip(src[:4], dst[:4])):
        k = -(-lens[p] // Z)
        slot_pages[b, :k] = table[p, :k]
        extra = perm[used + 1 + 4 * q: used + 1 + 4 * q + 4]  # pages for the decode steps
        slot_pages[b, k:k + 4] = extra
    slot_pages[4, 2] = copy_dst
    insert = jax.jit(functools.partial(steps.insert, params=SamplingParams(temperature=0.0), stop_ids=()))
    admission = steps.Admission(src=jnp.asarray(src), dst=jnp.asarray(dst), lens=jnp.asarray(lens[src]),
                                max_new=jnp.full(5, 100), ids=jnp.zeros((5, 2), jnp.int32), count=jnp.zeros(5, jnp.int32),
                                copy_src=jnp.asarray([table[0, 2]]), copy_dst=jnp.asarray([copy_dst]))
    cache, slots, _, _ = insert(cache, zeros_of(steps.Slots.abstract(B)), logits, admission, jax.random.PRNGKey(0))
    cache = PagedKVCache(k=cache.k, v=cache.v, page_table=jnp.asarray(slot_pages))
    seqs = [list(prompts[p]) + [int(np.argmax(logits[p]))] for p in src[:4]]
    step_logits = []
    tok, pos = slots.last_tok, slots.pos
    for _ in range(steps_n):
        lg, cache = _cached_step(graphdef, state, tok, pos, cache)
        step_logits.append(np.asarray(lg[:, 0]))
        tok, pos = jnp.argmax(lg[:, 0], -1).astype(jnp.int32), pos + 1
        for q, seq in enumerate(seqs):
            seq.append(int(tok[dst[q]]))
    full = _full_logits(model, seqs)
    for q, seq in enumerate(seqs):
        L = lens[src[q]]
        np.testing.assert_allclose(logits[src[q]], full[q, L - 1], atol=1e-5)
        for t in range(steps_n):
            np.testing.assert_allclose(step_logits[t][dst[q]], full[q, L + t], atol=1e-5)


def test_greedy_matches_full_forward_argmax(tiny):
    prompts = _prompts(5, tiny.cfg.vocab_size, seed=2)
    eng = Engine(tiny, SamplerConfig(batch_size=2, max_new_tokens=12, temperature=0.0))
    out = eng.generate([Request(p) for p in prompts])
    seqs = [ids + s.completion_ids for ids, [s] in zip(prompts, out)]
    full = _full_logits(tiny, seqs)
    for p, (ids, [s]) in enumerate(zip(prompts, out)):
        L = len(ids)
        assert s.completion_ids == np.argmax(full[p, L - 1:L + 11], -1).tolist()
        assert s.finish_reason == "length" and s.logprobs == [0.0] * 12


@pytest.fixture(scope="module")
def skewed():
    """Most requests short, a few long (per-request max_new_tokens), n = 2 samples each."""
    prompts = _prompts(14, 512, seed=4)
    lengths = [4] * 11 + [40] * 3
    np.random.RandomState(5).shuffle(lengths)
    return [Request(p, max_new_tokens=m, n=2) for p, m in zip(prompts, lengths)]


@pytest.fixture(scope="module")
def refill_runs(tiny, skewed):
    cfg = SamplerConfig(batch_size=8, temperature=1.0, top_p=0.95, top_k=50, seed=7, steps_per_call=16)
    runs = {}
    for refill in (True, False):
        eng = Engine(tiny, SamplerConfig(**{**cfg.__dict__, "refill": refill}))
        runs[refill] = (eng.generate(skewed), eng.last_stats, eng)
    return runs


def test_slot_refill_equals_fixed_batches_with_fewer_steps(refill_runs, skewed):
    (refilled, st_refill, _), (fixed, st_fixed, _) = refill_runs[True], refill_runs[False]
    assert _ids(refilled) == _ids(fixed)
    for a, b in zip(refilled, fixed):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
            assert x.finish_reason == y.finish_reason == "length"
    for req, samples in zip(skewed, refilled):
        assert [len(s.completion_ids) for s in samples] == [req.max_new_tokens] * 2
    # 28 samples of 4 or 40 tokens (6 long) on 8 slots: fixed batches pay ~40 steps per batch.
    assert st_refill.decode_steps < 0.75 * st_fixed.decode_steps, (st_refill, st_fixed)


def test_samples_share_prefill_differ_and_are_deterministic(tiny, refill_runs, skewed):
    refilled, stats, eng = refill_runs[True]
    assert stats.prefill_calls < len(skewed)  # prompts prefilled in groups, each once for its 2 samples
    assert any(a.completion_ids != b.completion_ids for a, b in refilled)
    before = eng.compile_count
    again = eng.generate(skewed, seed=7)
    assert _ids(again) == _ids(refilled)
    assert eng.compile_count == before, "same shape buckets must not recompile"
    other = eng.generate(skewed, seed=8)
    assert _ids(other) != _ids(refilled)
    # results do not depend on the batch size, page size or KV pool size (keys follow request/sample, not slots
    # or pages); a pool of 12 pages of 8 tokens (the longest sample needs 9) forces waiting and preemption
    for change in ({"batch_size": 3}, {"page_size": 4}, {"page_size": 8, "kv_pages": 12}):
        other_eng = Engine(tiny, SamplerConfig(**{**eng.cfg.__dict__, **change}))
        assert _ids(other_eng.generate(skewed)) == _ids(refilled), change
        if "kv_pages" in change:
            st = other_eng.last_stats
            assert st.preemptions > 0 and st.peak_pages <= 12 and st.pool_pages == 12, st


def test_on_finished_hands_each_sample_over_as_its_slot_ends(tiny, refill_runs, skewed):
    """on_finished(i, j, sample) comes once per sample with result[i][j] itself, while other slots still decode:
    samples are handed over after several different decode calls, the first long before the last."""
    refilled, _, eng = refill_runs[True]
    calls = []
    out = eng.generate(skewed, seed=7, on_finished=lambda i, j, s: calls.append((i, j, s, eng.last_stats.decode_calls)))
    total_calls = eng.last_stats.decode_calls
    assert _ids(out) == _ids(refilled)  # the hook changes nothing
    assert sorted((i, j) for i, j, _, _ in calls) == [(i, j) for i in range(len(skewed)) for j in range(2)]
    assert all(s is out[i][j] for i, j, s, _ in calls)
    at = [n for _, _, _, n in calls]  # decode calls made when each sample was handed over
    assert at == sorted(at) and len(set(at)) > 1 and at[0] < total_calls
    # Nothing waiting for a slot (32 slots, 28 samples), so nothing to refill: without a hook one decode call
    # runs the whole batch; with one, the short samples come out first, in a call of their own.
    wide = Engine(tiny, SamplerConfig(**{**eng.cfg.__dict__, "batch_size": 32, "steps_per_call": 64}))
    alone = wide.generate(skewed, seed=7)
    assert wide.last_stats.decode_calls == 1 and _ids(alone) == _ids(refilled)
    lengths = []
    assert _ids(wide.generate(skewed, seed=7, on_finished=lambda i, j, s: lengths.append(
        (wide.last_stats.decode_calls, len(s.completion_ids))))) == _ids(refilled)
    assert wide.last_stats.decode_calls > 1
    assert {n for c, n in lengths if c == 1} == {4} and {n for c, n in lengths if c > 1} == {40}
    # an exception in the hook ends the call
    with pytest.raises(RuntimeError, match="hook failed"):
        eng.generate(skewed, seed=7, on_finished=lambda i, j, s: (_ for _ in ()).throw(RuntimeError("hook failed")))
    assert _ids(eng.generate(skewed, seed=7)) == _ids(refilled)  # and leaves the engine usable


def test_logprobs_are_those_of_the_sampling_distribution(tiny, refill_runs, skewed):
    refilled, _, eng = refill_runs[True]
    params = SamplingParams(eng.cfg.temperature, eng.cfg.top_p, eng.cfg.top_k)
    for req, samples in list(zip(skewed, refilled))[:3]:
        s = samples[0]
        logits = _full_logits(tiny, [list(req.prompt_ids) + s.completion_ids], width=96)[0]
        logits = logits[len(req.prompt_ids) - 1:len(req.prompt_ids) - 1 + len(s.completion_ids)]
        logq = np.asarray(sampling_logprobs(jnp.asarray(logits), params))
        want = logq[np.arange(len(s.completion_ids)), s.completion_ids]
        np.testing.assert_allclose(s.logprobs, want, atol=1e-4)


def test_stop_token_ends_sample_and_is_kept(tiny):
    prompts = _prompts(3, 512, seed=6)
    base = Engine(tiny, SamplerConfig(batch_size=4, max_new_tokens=20, temperature=0.0)).generate(
        [Request(p) for p in prompts])
    stop = base[0][0].completion_ids[5]
    first = base[0][0].completion_ids.index(stop)
    eng = Engine(tiny, SamplerConfig(batch_size=4, max_new_tokens=20, temperature=0.0, stop_token_ids=(stop,)))
    out = eng.generate([Request(p) for p in prompts])
    assert out[0][0].completion_ids == base[0][0].completion_ids[:first + 1]
    assert out[0][0].finish_reason == "stop"
    for b, o in zip(base[1:], out[1:]):
        ids = b[0].completion_ids
        cut = ids.index(stop) + 1 if stop in ids else len(ids)
        assert o[0].completion_ids == ids[:cut]
        assert o[0].finish_reason == ("stop" if stop in ids else "length")


def test_stop_strings_cut_text_and_tokens(tiny, tmp_path):
    from vt.data.tokenizer import build_tiny_tokenizer
    tok = build_tiny_tokenizer(tmp_path / "tok")
    assert tok.vocab_size <= tiny.cfg.vocab_size
    prompts = [tok.encode("def fibonacci(n):"), tok.encode("Solve 2 + 3 =")]
    cfg = SamplerConfig(batch_size=2, max_new_tokens=24, temperature=0.0, stop_token_ids=())
    base = Engine(tiny, cfg, tokenizer=tok).generate([Request(p) for p in prompts])
    text = base[0][0].text
    assert text == tok.decode(base[0][0].completion_ids, skip_special_tokens=True)
    stop_s = text[len(text) // 2: len(text) // 2 + 3]
    assert stop_s
    eng = Engine(tiny, SamplerConfig(**{**cfg.__dict__, "stop_strings": (stop_s,), "steps_per_call": 4}),
                 tokenizer=tok)
    s = eng.generate([Request(p) for p in prompts])[0][0]
    assert s.finish_reason == "stop"
    assert s.text == text[:text.index(stop_s)]
    assert base[0][0].completion_ids[:len(s.completion_ids)] == s.completion_ids
    assert stop_s in tok.decode(s.completion_ids, skip_special_tokens=True)
    assert stop_s not in tok.decode(s.completion_ids[:-1], skip_special_tokens=True)
    assert len(s.logprobs) == len(s.completion_ids)


def test_update_weights_changes_outputs_without_retrace(tiny):
    graphdef, state = nnx.split(tiny)
    eng = Engine((graphdef, state), SamplerConfig(batch_size=4, max_new_tokens=8, temperature=0.0))
    reqs = [Request(p) for p in _prompts(4, 512, seed=9)]
    before = eng.generate(reqs)
    count = eng.compile_count
    _, other = nnx.split(create_model(preset("tiny"), seed=4))
    eng.update_weights(other)
    after = eng.generate(reqs)
    assert eng.compile_count == count
    assert _ids(after) != _ids(before)
    eng.update_weights(state)
    assert _ids(eng.generate(reqs)) == _ids(before)
    assert eng.compile_count == count
    _, wrong = nnx.split(create_model(preset("tiny", hidden_size=48, num_heads=3, num_kv_heads=1)))
    with pytest.raises(VtError, match="update_weights"):
        eng.update_weights(wrong)


def test_context_limit_and_bad_requests(tiny):
    eng = Engine(tiny, SamplerConfig(batch_size=2, max_new_tokens=50, temperature=0.0, max_context=40))
    [[s]] = eng.generate([Request(list(range(30)))])
    assert len(s.completion_ids) == 10 and s.finish_reason == "length"
    for bad, msg in [([], "empty"), ([1, 512], "out of the vocabulary"), ([-1], "out of the vocabulary"),
                     (list(range(40)), "context"), ([1.5], "integers")]:
        with pytest.raises(VtError, match=msg):
            eng.generate([Request([1, 2]), Request(bad)])
    with pytest.raises(VtError, match="request 0"):
        eng.generate([Request([1], max_new_tokens=0)])
    with pytest.raises(VtError, match="stop_strings"):
        Engine(tiny, SamplerConfig(stop_strings=("x",)))


def test_the_pallas_decode_kernel_samples_what_the_xla_path_samples(tiny):
    """decode_attention="pallas" (JAX's Pallas GPU kernel; Pallas's interpreter on CPU) against "xla": the same
    tokens and log-probs within 1e-5 (fp32), through prefill, refill of finished slots and n samples a prompt."""
    reqs = [Request(p, max_new_tokens=m, n=2) for p, m in zip(_prompts(5, tiny.cfg.vocab_size, seed=8),
                                                               [5, 40, 12, 3, 25])]
    runs = {k: Engine(tiny, SamplerConfig(batch_size=4, temperature=1.0, stop_token_ids=(), steps_per_call=8,
                                          decode_attention=k)).generate(reqs, seed=2) for k in ("xla", "pallas")}
    assert _ids(runs["pallas"]) == _ids(runs["xla"])
    for a, b in zip(runs["pallas"], runs["xla"]):
        for s, t in zip(a, b):
            np.testing.assert_allclose(s.logprobs, t.logprobs, atol=1e-5, rtol=0)
    with pytest.raises(VtError, match="decode_attention.*got 'triton'"):
        SamplerConfig(decode_attention="triton")


def test_long_cache_greedy_matches_full_forward(tiny):
    """max_new_tokens 1100 fills 70 pages of 16 tokens, which decode attends to block by block (vt.model.kv_pages.
    PAGES_PER_BLOCK pages per block, an online softmax across blocks): every greedy token must be the full forward pass's argmax at its position, up to 1e-4 in
    logit (near-ties over 3 x 1100 positions may resolve either way under fp32 reassociation)."""
    from vt.model.kv_pages import PAGES_PER_BLOCK
    prompts = _prompts(3, tiny.cfg.vocab_size, seed=6)
    new = 1100
    S = bucket(max(len(p) for p in prompts) + new, 16, half_octaves=True)
    assert new > 4 * PAGES_PER_BLOCK * 16  # many page blocks
    out = Engine(tiny, SamplerConfig(batch_size=3, max_new_tokens=new, temperature=0.0, stop_token_ids=(),
                                     steps_per_call=128)).generate([Request(p) for p in prompts])
    seqs = [ids + s.completion_ids for ids, [s] in zip(prompts, out)]
    full = _full_logits(tiny, seqs, width=S)
    for p, (ids, [s]) in enumerate(zip(prompts, out)):
        L = len(ids)
        assert len(s.completion_ids) == new
        logits = full[p, L - 1:L - 1 + new]
        chosen = np.take_along_axis(logits, np.asarray(s.completion_ids)[:, None], -1)[:, 0]
        np.testing.assert_allclose(chosen, logits.max(-1), atol=1e-4, rtol=0)
