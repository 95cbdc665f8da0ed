"""Offline self-distillation (RECIPE stage 4): sample the math / code / STEM RL checkpoints, keep verified
traces, score them with the student's length-normalised NLL, keep the middle-to-high band per domain and
length bucket, mix domains into an SFT set.

Run:

    vt self-distill --config configs/self_distill.py --workdir runs/self_distill
    vt train --config configs/sft_stage1.py --workdir runs/sft_self_distill \
        --config.data.train=runs/self_distill/selected.jsonl --config.model.init_checkpoint=runs/student

The report publishes no thresholds: every band and bucket edge below is a starting point to tune.

Variant `smoke` shrinks the sizes (4 math prompts x 2 samples, 16 new tokens, code and STEM skipped), not the
inputs, so it cannot run on its own: it still reads a student checkpoint, its tokenizer and a math RL checkpoint
with its prompts, which earlier stages produce. Point it at small ones, e.g. a finished `vt demo` run (or
`vt pipeline`) in demo_out/:

    vt self-distill --config configs/self_distill.py:smoke --workdir /tmp/sd_smoke \
        --config.student=STUDENT_CKPT --config.tokenizer=TOKENIZER \
        --config.sources.math.ckpt=MATH_RL_CKPT --config.sources.math.data=PROMPTS.jsonl

Missing inputs are named by their config field before anything loads.
"""
import ml_collections

from configs.common import parse_arg, rewards_section, sampler


def rule(min_tokens, edges, lo, hi, weight):
    r = ml_collections.ConfigDict()
    r.min_tokens = min_tokens  # "exclude very short traces"
    r.length_edges = edges  # domain-specific length buckets (tokens); ranking happens inside each bucket
    r.band_lo = lo  # drop the lowest-S_LP ranks below floor(lo * N): traces the student already predicts
    r.band_hi = hi  # drop ranks from floor(hi * N): "extreme high-score outliers"
    r.weight = weight  # share of the mixed set
    return r


def source(ckpt, data, n):
    s = ml_collections.ConfigDict()
    s.ckpt = ckpt  # RL checkpoint of this domain ("" = skip the domain)
    s.data = data  # prompts with references (verl parquet / JSONL)
    s.n = n  # samples per prompt
    s.limit = 0  # first N prompts (0 = all)
    return s


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = ml_collections.ConfigDict()
    c.student = "runs/sft_stage2/merged"  # the student (scores traces, then gets fine-tuned on them)
    c.tokenizer = "checkpoints/qwen2.5-coder-3b-hf"  # shared by all checkpoints
    c.dtype = "bfloat16"  # compute dtype for sampling and scoring
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1  # shard the student over all devices while scoring
    c.mesh.tensor = 1

    c.sources = ml_collections.ConfigDict()
    c.sources.math = source("runs/rl_math/final", "data/rl/math.parquet", 8)
    c.sources.code = source("runs/rl_code/final", "data/rl/code.jsonl", 8)
    c.sources.stem = source("runs/rl_stem/final", "data/rl/stem.jsonl", 8)

    # vt.sampling.SamplerConfig: n is overridden per source by sources.<domain>.n; RECIPE sampling settings
    c.sampling = sampler(n=8, temperature=1.0, top_p=0.95, top_k=-1, max_new_tokens=32768, batch_size=256)

    c.scoring = ml_collections.ConfigDict()
    c.scoring.batch_size = 8  # rows per forward; must divide by data x fsdp devices
    c.scoring.chunk_tokens = 4096  # KV-cache chunks: fp32 logits of [8, 4096, 152K] ~ 20 GB, not [8, 32K, 152K]
    c.scoring.min_bucket = 256

    c.selection = ml_collections.ConfigDict()
    c.selection.rules = ml_collections.ConfigDict()
    c.selection.rules.math = rule(512, (4096, 8192, 16384), 0.3, 0.95, 0.5)
    c.selection.rules.code = rule(256, (2048, 4096, 8192), 0.3, 0.95, 0.3)
    c.selection.rules.stem = rule(256, (2048, 4096, 8192), 0.3, 0.95, 0.2)
    c.selection.total = 0  # 0 = keep every in-band trace; else the mixed set's size
    c.selection.seed = 0

    c.rewards = rewards_section()  # the verifiers' options (vt.rewards.registry): rewards.code.workers, ...
    c.progress = True

    if variant == "smoke":
        c.dtype = "float32"
        c.mesh.fsdp = 1
        c.sources.code.ckpt = ""
        c.sources.stem.ckpt = ""
        c.sources.math.limit = 4
        c.sources.math.n = 2
        c.sampling.max_new_tokens = 16
        c.sampling.batch_size = 8
        c.scoring.chunk_tokens = 0
        c.scoring.min_bucket = 64
        c.progress = False
    return c
