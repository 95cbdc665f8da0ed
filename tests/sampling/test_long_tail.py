"""A long tail on the paged KV cache: 64 prompts x 4 samples, one sample 8K tokens long and the others under
64, in a pool of pages sized for what is live rather than for every slot at the longest length."""
import numpy as np

from vt.buckets import bucket
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.sampling.config import Request, SamplerConfig
from vt.sampling.engine import Engine
from vt.sampling.page_table import pages_for


def test_long_tail_finishes_in_few_pages():
    model = create_model(preset("tiny", max_position_embeddings=8192 + 128), seed=3)
    rng = np.random.RandomState(0)
    prompts = [rng.randint(0, 512, rng.randint(16, 65)).tolist() for _ in range(64)]
    short = rng.randint(8, 64, size=64)
    requests = [Request(p, max_new_tokens=int(m), n=4) for p, m in zip(prompts[:-1], short)]
    requests += [Request(prompts[-1], max_new_tokens=int(short[-1]), n=3), Request(prompts[-1], max_new_tokens=8192)]
    B, Z, pool = 64, 16, 800
    eng = Engine(model, SamplerConfig(batch_size=B, temperature=1.0, stop_token_ids=(), steps_per_call=256,
                                      page_size=Z, kv_pages=pool))
    out = eng.generate(requests)
    assert [len(s.completion_ids) for s in out[-1]] == [8192]
    for req, samples in zip(requests, out):
        assert [len(s.completion_ids) for s in samples] == [req.max_new_tokens] * (req.n or 1)
    st = eng.last_stats
    # pages in use at the peak vs the pages the live tokens needed at theirs (shared prompt pages once)
    assert st.peak_pages <= 1.25 * st.peak_pages_needed, st
    assert st.peak_pages_needed >= pages_for(len(prompts[-1]) + 8191, Z), st
    # the KV bytes of the engine before pages: B rows of the longest sample's length bucket
    dense_bytes = B * bucket(len(prompts[-1]) + 8192, 16, half_octaves=True) * st.page_bytes // Z
    assert dense_bytes >= 4 * st.pool_pages * st.page_bytes, (dense_bytes, st)
    assert st.tokens == sum(len(s.completion_ids) for samples in out for s in samples)
    print(f"long tail: peak pages {st.peak_pages}, needed {st.peak_pages_needed}, pool {st.pool_pages} "
          f"({st.pool_pages * st.page_bytes} bytes) vs dense {dense_bytes} bytes; {st.decode_steps} decode steps, "
          f"{st.preemptions} preemptions")
