"""What a sampler is asked for: its settings (`SamplerConfig`, a config file's `sampler` section) and a request.

Imports no JAX: config files build their sampler sections from here (configs/common.py), and loading a config
stays on the host's side of vt.config's boundary.
"""
from __future__ import annotations

import dataclasses
from typing import Annotated, Sequence

from vt.validation import AT_LEAST_1, NON_NEGATIVE, FieldError, Range, check_fields

DECODE_KERNELS = ("auto", "xla", "pallas")  # vt.model.kv_pages.PagedKVCache.decode_kernel


@dataclasses.dataclass(frozen=True)
class ToolsConfig:
    """Tool calls inside the rollout (vt.tools): a sample whose turn ends a `<tool_call>` is parked, the call runs
    in the background, and the sample goes on with the tool's turn appended (vt.sampling.engine)."""
    tools: tuple[str, ...] = ("python",)  # names in vt.tools.registry.TOOLS the policy may call
    max_turns: Annotated[int, AT_LEAST_1] = 4  # tool calls per sample; a call past them ends it ("max_turns")
    max_tool_output_tokens: Annotated[int, AT_LEAST_1] = 256  # a longer output is cut, with a visible note
    timeout_s: Annotated[float, Range(gt=0)] = 5.0  # wall clock of one call (the python tool's sandbox run)
    memory_bytes: Annotated[int, AT_LEAST_1] = 512 << 20  # the python tool's run, all its processes together
    workers: Annotated[int, AT_LEAST_1] = 8  # calls run at once (threads; the python tool's sandboxes)

    def __post_init__(self):
        check_fields(self)
        if not self.tools:
            raise FieldError(type(self).__name__, "tools", "is empty (leave the sampler's tools unset for none)")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    batch_size: Annotated[int, AT_LEAST_1] = 64  # decode slots B: samples generated concurrently
    max_new_tokens: Annotated[int, AT_LEAST_1] = 256  # default per request; a Request may set its own
    temperature: Annotated[float, NON_NEGATIVE] = 1.0  # 0 = greedy
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0  # 1 = off
    top_k: Annotated[int, Range(ge=-1)] = -1  # -1 = off (0 is refused)
    n: Annotated[int, AT_LEAST_1] = 1  # samples per request (a Request may set its own); they share one prefill
    seed: Annotated[int, NON_NEGATIVE] = 0
    stop_token_ids: tuple[int, ...] | None = None  # None: tokenizer eos ids, else the Qwen ids in the vocab
    stop_strings: tuple[str, ...] = ()  # need a tokenizer; checked on the host between decode calls
    max_context: Annotated[int | None, AT_LEAST_1] = None  # prompt + completion; None: the model's maximum
    steps_per_call: Annotated[int, AT_LEAST_1] = 64  # most decode steps per host round trip
    refill: bool = True  # False: fixed batches (a batch waits for its longest sample); for comparison
    refill_min_free: Annotated[int, NON_NEGATIVE] = 0  # free slots ending a decode call; 0: max(1, B // 8)
    prefill_tokens: Annotated[int, AT_LEAST_1] = 8192  # most (padded prompts x bucket length) per prefill call
    min_prompt_bucket: Annotated[int, AT_LEAST_1] = 16
    min_prefill_rows: Annotated[int, AT_LEAST_1] = 8  # prefill rows padded to a power of two >= this: fewer programs
    page_size: Annotated[int, AT_LEAST_1] = 16  # tokens per KV page
    kv_pages: Annotated[int, NON_NEGATIVE] = 0  # KV pool size in pages; 0: kv_memory_fraction of the free device memory
    kv_memory_fraction: Annotated[float, Range(gt=0, le=1)] = 0.5  # capped at every slot at its longest
    # The kernel of a decode step's attention (vt.model.kv_pages.PagedKVCache.decode_kernel): "auto" (Pallas on
    # TPU, XLA elsewhere), "pallas" (also JAX's Pallas kernel on GPU; needs each KV head's pages whole on a
    # device) or "xla".
    decode_attention: str = "auto"
    tools: ToolsConfig | None = None  # None: no tool calls (a sample is one completion)

    def __post_init__(self):
        # FieldError: a config file's sampler section names the bad field by its dotted path (vt.config)
        check_fields(self)
        if self.stop_strings and any(not s for s in self.stop_strings):
            raise FieldError(type(self).__name__, "stop_strings", "holds an empty string")
        if self.top_k == 0:
            raise FieldError(type(self).__name__, "top_k", "must be -1 (off) or >= 1, got 0")
        if self.decode_attention not in DECODE_KERNELS:
            raise FieldError(type(self).__name__, "decode_attention",
                             f"must be one of {', '.join(DECODE_KERNELS)}, got {self.decode_attention!r}")


@dataclasses.dataclass(frozen=True)
class Request:
    prompt_ids: Sequence[int]
    max_new_tokens: int | None = None  # None: SamplerConfig.max_new_tokens
    n: int | None = None  # None: SamplerConfig.n
