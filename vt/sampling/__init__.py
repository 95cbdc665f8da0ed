"""The JAX rollout engine: prefill + decode with a KV cache, sampling rules, stop conditions, slot refill."""
from vt.sampling.engine import Engine, Request, Sample, SamplerConfig, Stats, check_prompt  # noqa: F401
from vt.sampling.rules import SamplingParams, sample, sampling_logprobs  # noqa: F401
