"""Decoder architecture settings (Qwen2 / Qwen2.5 and dense Qwen3), presets, and the mapping to and from Hugging
Face `config.json`. The two families differ only in fields of `ModelConfig`: Qwen3 drops the q/k/v bias
(`attention_bias`), RMS-normalises each head's query and key before the rotary embedding (`qk_norm`) and states
`head_dim` explicitly; `hf_architecture` names the transformers class a config is."""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from vt import VtError

IMPLS = ("xla", "jax", "splash", "auto")
"""xla: vt's einsum attention (any backend; rows of two `ATTENTION_BLOCK`s or more are attended to block by block,
vt.model.blocked_attention, in blocks of `attention_block`); jax: `jax.nn.dot_product_attention`, cuDNN flash
attention on NVIDIA GPUs with a bf16/fp16 compute dtype (it has no fp32 kernel), its XLA form elsewhere (unpinned,
JAX picks XLA everywhere); splash: the Pallas splash-attention kernel (`vt.model.splash`), flash attention on TPUs
(Pallas interpret mode, slow, elsewhere); auto: splash on TPU, jax on NVIDIA GPUs with a bf16/fp16 compute dtype,
xla otherwise."""

# projection -> (submodule of a decoder layer, number of leading input dims of its kernel)
PROJECTIONS = {"q": ("attn", 1), "k": ("attn", 1), "v": ("attn", 1), "o": ("attn", 2),
               "gate": ("mlp", 1), "up": ("mlp", 1), "down": ("mlp", 1)}

REMAT_POLICIES = ("auto", "none", "full", "save_attention", "dots", "dots_no_batch")
"""none: keep all activations; full: recompute each decoder layer in the backward pass; save_attention: full, but
keep the blocked attention's output and log-sum-exp (one [B, T, N * H] and one [B, N, T] a layer), so the recompute
skips the attention's block loops; dots: save matmul outputs, recompute the rest; dots_no_batch: save only weight
matmuls (no attention scores);
auto: save_attention below `REMAT_BELOW_WIDTH`, none from there up (`resolve_remat`)."""

# Below this hidden size "auto" recomputes each decoder layer in the backward pass, all but its attention
# (save_attention): keeping the layer's activations costs more than recomputing so narrow a layer. The layer scan
# stacks every saved activation over the layers (a buffer allocated, copied and written in place per layer), while
# the recompute is a few small matmuls; the attention's block loops are the one part worth keeping (O(T^2) work for
# an output the size of the layer's input). Train step on a 2-core CPU, 8 x 256 rows (bench/train_step.py shapes),
# policies in one process, steps alternated, fastest step: width 96 (tiny preset) save_attention 65.3 ms, full 70.3,
# none 77.2; width 256 (8 heads of 32, MLP 512) 242.1 / 249.9 / 302.8; width 512 (8 of 64, MLP 1024) save_attention
# 670.6 vs none 742.6; width 768 (12 of 64, MLP 4096) 3278 vs 3233 (the crossover); width 896 (qwen2.5-0.5b, 2
# layers, 2 x 256) 4217 vs 3545. save_attention also holds half the temporary memory of none at these widths. From
# there up, memory decides: the production configs choose their policy explicitly (at coder-3b's widths, 36 layers,
# bench/compile.py's SFT step: temp 35.26 GB under full, 37.76 GB under save_attention).
REMAT_BELOW_WIDTH = 768


def resolve_remat(policy: str, hidden_size: int) -> str:
    """The policy `policy` runs as for a model of width `hidden_size`: "auto" decided, the others as they are."""
    if policy != "auto":
        return policy
    return "save_attention" if hidden_size < REMAT_BELOW_WIDTH else "none"

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 means hidden_size // num_heads, as in Qwen2; Qwen3 states it (0.6B: 1024 / 16 heads, 128)
    attention_bias: bool = True  # bias on the q/k/v projections (Qwen2); Qwen3 has none
    qk_norm: bool = False  # RMSNorm over head_dim of each query and key head, before the rotary embedding (Qwen3)
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    # The embedding table is padded to a multiple of this so the vocab axis shards evenly; logits are cut back
    # to vocab_size, so padding rows never receive probability mass.
    vocab_pad_multiple: int = 128
    param_dtype: str = "float32"
    dtype: str = "float32"  # compute dtype of activations and matmuls
    attention_impl: str = "xla"
    # The no-cache attention also lets a branch segment see its prefix document (vt.model.segments): the RL
    # learner's rows with shared prompts. Off elsewhere: it costs a second compare per score (3-7% of the tiny SFT
    # step). Not part of the architecture; never set in a saved config.
    segment_branches: bool = False
    remat_policy: str = "auto"  # REMAT_POLICIES
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151643
    initializer_range: float = 0.02
    # LoRA adapters (vt.model.lora): rank 0 = none. alpha / rank scales the adapters' term; dropout applies to
    # the adapters' input while training; targets is a regex matched against each whole projection name.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: str = "q|k|v|o|gate|up|down"

    def __post_init__(self):
        _check_types(self)
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise VtError(f"model config: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise VtError(f"model config: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise VtError(f"model config: head_dim {self.head_dim} must be even for rotary embeddings")
        for name, allowed in (("attention_impl", IMPLS), ("remat_policy", REMAT_POLICIES),
                              ("param_dtype", DTYPES), ("dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise VtError(f"model config: field '{name}' is {getattr(self, name)!r}; expected one of {allowed}")
        hf_architecture(self)  # a combination of the architecture fields no family has is refused here, not at export
        if self.lora_rank < 0 or self.lora_alpha <= 0 or not 0.0 <= self.lora_dropout < 1.0:
            raise VtError(f"model config: fields lora_rank={self.lora_rank} (>= 0), lora_alpha={self.lora_alpha} "
                          f"(> 0), lora_dropout={self.lora_dropout} (in [0, 1)) out of range")
        if self.lora_rank:
            targets(self.lora_targets)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "vocab_pad_multiple"):
            if getattr(self, name) <= 0:
                raise VtError(f"model config: field '{name}' must be positive, got {getattr(self, name)}")

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_pad_multiple
        return int(math.ceil(self.vocab_size / m) * m)

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs of one trained token in rows of `seq_len` (every position of a packed row counts): 6 N for
        the weights (`param_count`) plus 12 L (heads * head_dim) T for attention scores and values, forward and
        backward (PaLM appendix B). MFU is these per second over the devices' peak (vt.distributed.PEAK_FLOPS)."""
        return 6.0 * param_count(self) + 12.0 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model config") -> "ModelConfig":
        if not isinstance(d, dict):
            raise VtError(f"{source}: expected a JSON object, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise VtError(f"{source}: unknown field(s) {unknown}")
        try:
            return cls(**d)
        except TypeError as e:
            raise VtError(f"{source}: {e}") from None
        except VtError as e:  # name the file rather than "model config"
            raise VtError(f"{source}: {str(e).removeprefix('model config: ')}") from None


def _kind_ok(value, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"bool": bool, "str": str}[kind])


def _check_types(cfg: ModelConfig) -> None:
    """A field of the wrong JSON type (``"hidden_size": "96"``) is named here, not met later as a TypeError
    deep in shape arithmetic."""
    for f in dataclasses.fields(cfg):
        kind = str(f.type).replace(" | None", "")
        value = getattr(cfg, f.name)
        if value is None and "None" in str(f.type):
            continue
        if kind in ("int", "float", "bool", "str") and not _kind_ok(value, kind):
            raise VtError(f"model config: field '{f.name}' must be {kind}, got {type(value).__name__} {value!r}")
        if kind == "float":
            object.__setattr__(cfg, f.name, float(value))


# (attention_bias, qk_norm) -> Hugging Face (model_type, architecture class)
ARCHITECTURES = {(True, False): ("qwen2", "Qwen2ForCausalLM"), (False, True): ("qwen3", "Qwen3ForCausalLM")}


def hf_architecture(cfg: ModelConfig) -> tuple[str, str]:
    """The transformers (model_type, class) `cfg` is; a combination of fields that is neither is an error."""
    arch = ARCHITECTURES.get((cfg.attention_bias, cfg.qk_norm))
    if arch is None:
        raise VtError(f"model config: fields attention_bias={cfg.attention_bias}, qk_norm={cfg.qk_norm} describe "
                      "no supported architecture (Qwen2: bias and no q/k norm; Qwen3: q/k norm and no bias)")
    return arch


def param_count(cfg: ModelConfig, *, padded: bool = False) -> int:
    """Parameters of the model. With padded=False the vocab padding rows are not counted, so the
    number agrees with Hugging Face (coder-3b: 3,085,938,688 with tied embeddings)."""
    V = cfg.padded_vocab_size if padded else cfg.vocab_size
    D, F, H = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    N, K = cfg.num_heads, cfg.num_kv_heads
    bias = (N * H + 2 * K * H) if cfg.attention_bias else 0
    attn = D * N * H + 2 * D * K * H + N * H * D + bias + (2 * H if cfg.qk_norm else 0)
    layer = attn + 3 * D * F + 2 * D
    head = 0 if cfg.tie_word_embeddings else V * D
    return V * D + cfg.num_layers * layer + D + head


PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                                num_heads=14, num_kv_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": ModelConfig(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                                num_heads=12, num_kv_heads=2, tie_word_embeddings=True),
    "qwen2.5-3b": ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                              num_heads=16, num_kv_heads=2, tie_word_embeddings=True),
    "qwen2.5-coder-3b": ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                                    num_heads=16, num_kv_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": ModelConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                              num_heads=28, num_kv_heads=4, tie_word_embeddings=False, max_position_embeddings=131072),
    # VibeThinker-1.5B's base (RECIPE.md): Qwen2.5-1.5B's shape, but rope_theta 1e4 and a 4,096-token context
    # (Qwen/Qwen2.5-Math-1.5B config.json; its sliding_window 4096 is unused: use_sliding_window false).
    "qwen2.5-math-1.5b": ModelConfig(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                                     num_heads=12, num_kv_heads=2, tie_word_embeddings=True, rope_theta=10000.0,
                                     max_position_embeddings=4096),
    # Qwen3 dense (Qwen/Qwen3-*/config.json on the Hugging Face hub and the model cards' tables): no q/k/v bias,
    # q/k RMSNorm, head_dim 128 whatever the width, 8 KV heads, max_position_embeddings 40960, rope_theta 1e6,
    # embeddings tied up to 4B; eos 151645 (<|im_end|>: the released checkpoints are the post-trained ones).
    **{name: ModelConfig(vocab_size=151936, hidden_size=D, intermediate_size=F, num_layers=L, num_heads=N,
                         num_kv_heads=8, head_dim=128, attention_bias=False, qk_norm=True, tie_word_embeddings=tie,
                         max_position_embeddings=40960, eos_token_id=151645)
       for name, D, F, L, N, tie in (("qwen3-0.6b", 1024, 3072, 28, 16, True), ("qwen3-1.7b", 2048, 6144, 28, 16, True),
                                     ("qwen3-4b", 2560, 9728, 36, 32, True), ("qwen3-8b", 4096, 12288, 36, 32, False))},
    # Qwen3-4B-Instruct-2507 / -Thinking-2507 (one architecture): 4B's shape, rope_theta 5e6, 262,144 positions.
    "qwen3-4b-2507": ModelConfig(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                                 num_heads=32, num_kv_heads=8, head_dim=128, attention_bias=False, qk_norm=True,
                                 tie_word_embeddings=True, rope_theta=5_000_000.0, max_position_embeddings=262144,
                                 eos_token_id=151645),
    # Tests and the CPU demo: odd sizes on purpose so shape bugs cannot hide behind square matrices.
    "tiny": ModelConfig(vocab_size=512, hidden_size=96, intermediate_size=160, num_layers=3, num_heads=6,
                        num_kv_heads=2, max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=None),
    # The tiny model's Qwen3-shaped twin: head_dim 24 != 96 / 6 heads, no q/k/v bias, q/k norms.
    "tiny-qwen3": ModelConfig(vocab_size=512, hidden_size=96, intermediate_size=160, num_layers=3, num_heads=6,
                              num_kv_heads=2, head_dim=24, attention_bias=False, qk_norm=True,
                              max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=True,
                              bos_token_id=None, eos_token_id=None),
}


def targets(pattern: str) -> list[str]:
    """The projections `pattern` (a regex, matched against each whole name) selects; an error if none."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise VtError(f"model config: field 'lora_targets' {pattern!r} is not a regular expression ({e})") from None
    names = [n for n in PROJECTIONS if rx.fullmatch(n)]
    if not names:
        raise VtError(f"model config: field 'lora_targets' {pattern!r} matches none of {list(PROJECTIONS)}")
    return names


def architecture(cfg: ModelConfig) -> dict:
    """The fields of a ModelConfig that fix the parameters' shapes (not dtypes or kernels)."""
    return {k: v for k, v in cfg.to_dict().items()
            if k not in ("param_dtype", "dtype", "attention_impl", "remat_policy", "vocab_pad_multiple",
                         "lora_dropout", "segment_branches")}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise VtError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


# --- Hugging Face config.json -------------------------------------------------------------------------------

_HF_FIELD_KINDS = {
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"), "int"),
    **dict.fromkeys(("rope_theta", "rms_norm_eps", "initializer_range"), "float"),
    **dict.fromkeys(("tie_word_embeddings", "use_sliding_window", "attention_bias"), "bool"),
}


def from_hf_config(hf: dict[str, Any], source: str = "config.json", **overrides) -> ModelConfig:
    """Read a transformers Qwen2 or Qwen3 (dense) `config.json` dict. Features vt does not implement are errors,
    not ignored."""
    if not isinstance(hf, dict):
        raise VtError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    known = {mt: cls for mt, cls in ARCHITECTURES.values()}
    if model_type not in known or (archs and known[model_type] not in archs):
        raise VtError(f"{source}: field 'model_type' is {model_type!r} (architectures {archs}); vt supports "
                      + ", ".join(f"'{mt}' ({cls})" for mt, cls in known.items()))
    for key, kind in _HF_FIELD_KINDS.items():
        if hf.get(key) is not None and not _kind_ok(hf[key], kind):
            raise VtError(f"{source}: field '{key}' must be {kind}, got {type(hf[key]).__name__} {hf[key]!r}")
    qwen3 = model_type == "qwen3"
    # Qwen3's attention_bias also puts a bias on o_proj; no released Qwen3 sets it and vt does not implement it.
    if qwen3 and hf.get("attention_bias", False):
        raise VtError(f"{source}: field 'attention_bias' is true; vt implements Qwen3 without attention biases")
    if any(t != "full_attention" for t in hf.get("layer_types") or ()):
        raise VtError(f"{source}: field 'layer_types' lists {sorted(set(hf['layer_types']))}; vt implements only "
                      "'full_attention' layers")

    def need(key):
        if key not in hf:
            raise VtError(f"{source}: missing field '{key}'")
        return hf[key]

    if hf.get("hidden_act", "silu") != "silu":
        raise VtError(f"{source}: field 'hidden_act' is {hf['hidden_act']!r}; Qwen2 and Qwen3 use 'silu'")
    # transformers 5 moved rope settings into `rope_parameters`; 4.x keeps `rope_theta`/`rope_scaling`.
    rope = hf.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = hf.get("rope_scaling")
    if rope_type != "default" or (scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default")):
        raise VtError(f"{source}: field 'rope_scaling'/'rope_parameters' asks for {scaling or rope}; "
                      "vt implements only default rotary embeddings")
    rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    if hf.get("use_sliding_window", False):
        raise VtError(f"{source}: field 'use_sliding_window' is true; vt does not implement sliding-window attention")
    layers = need("num_hidden_layers")
    heads = need("num_attention_heads")
    kwargs = dict(
        vocab_size=need("vocab_size"), hidden_size=need("hidden_size"), intermediate_size=need("intermediate_size"),
        num_layers=layers, num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
        # Qwen3Config's head_dim defaults to 128 (not hidden / heads), so a config.json without one means 128.
        head_dim=hf.get("head_dim") or (128 if qwen3 else 0), attention_bias=not qwen3, qk_norm=qwen3,
        max_position_embeddings=hf.get("max_position_embeddings", 32768), rope_theta=float(rope_theta),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=_first_id(hf.get("bos_token_id")), eos_token_id=_first_id(hf.get("eos_token_id")),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )
    # torch_dtype is not read: the stored dtype is a property of the weights, not of the architecture, and the
    # parameter and compute dtypes are vt's own choice (float32 unless overridden).
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def _first_id(v):
    if isinstance(v, list):
        return v[0] if v else None
    return v


def to_hf_config(cfg: ModelConfig, *, torch_dtype: str = "float32") -> dict[str, Any]:
    """A `config.json` dict that transformers loads as Qwen2ForCausalLM or Qwen3ForCausalLM (`hf_architecture`)."""
    model_type, cls = hf_architecture(cfg)
    extra = {"attention_bias": False} if model_type == "qwen3" else {}
    return {
        "architectures": [cls],
        "model_type": model_type,
        **extra,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.num_layers,
        "attention_dropout": 0.0,
        "initializer_range": cfg.initializer_range,
        "use_cache": True,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "torch_dtype": torch_dtype,
    }
