"""AIME 2025 (30 problems, verl parquet as the VibeThinker evaluation uses it): avg@64, pass@k, cons@64.

Run:

    vt eval --config configs/eval_aime25.py --ckpt checkpoints/vibethinker --tokenizer checkpoints/vibethinker-hf \
        --out runs/eval/aime25

With CLR (K = 32 trajectories, M = 5 claims, mean over 8 runs needs n >= 256):

    vt eval --config configs/eval_aime25.py:clr --ckpt ... --tokenizer ... --out runs/eval/aime25_clr

Smoke (tiny random model and tokenizer, 2 problems, a few tokens, on CPU):

    vt eval --config configs/eval_aime25.py:smoke --out /tmp/eval_smoke
"""
import ml_collections

from configs.common import logging_section, parse_arg, rewards_section, sampler


def get_config(arg=None):
    variant = parse_arg(arg, "clr", "smoke")
    c = ml_collections.ConfigDict()
    c.name = "aime25"  # label in the summary table and plot
    c.data = "tests/assets/aime25.parquet"  # verl parquet: prompt messages + reward_model.ground_truth
    c.domain = "math"  # reward: last \boxed{} after </think>, math-verify with gold first
    c.limit = 0  # 0 = all 30 problems
    c.system_prompt = ""  # the file's prompts already ask for \boxed{}; VibeThinker's eval adds no system prompt
    c.prompt_suffix = ""  # appended to each problem's user message
    c.ks = (1, 2, 4, 8, 16, 32, 64)  # unbiased pass@k reported for these k
    c.maj_ks = (8, 16, 32, 64)  # majority vote over the first k samples; maj@64 = cons@64
    c.chunk_problems = 8  # problems per generate call; the resume unit (seeds are per chunk)
    c.cluster_with_math_verify = True  # wrong answers equal under math-verify vote together
    c.save_text = True  # keep completions in results.jsonl (CLR and error analysis need them)
    c.progress = True  # tqdm bar over problems
    c.rewards = rewards_section()  # the domain's options (vt.rewards.registry)
    c.rewards.math.workers = 2  # math-verify worker processes

    c.model = ml_collections.ConfigDict()
    c.model.ckpt = ""  # set with --ckpt
    c.model.tokenizer = ""  # set with --tokenizer
    c.model.preset = ""  # smoke only: random-init preset when ckpt is empty
    c.model.dtype = "bfloat16"  # compute dtype; logits are fp32
    c.model.attention_impl = "auto"  # prefill: splash on TPU, cuDNN flash on NVIDIA GPUs with bf16, xla elsewhere
    c.model.mesh = ml_collections.ConfigDict()
    c.model.mesh.data = 1  # replicas
    c.model.mesh.fsdp = 1  # parameter sharding (set -1 to use all devices)
    c.model.mesh.tensor = 1  # tensor parallel over heads / MLP

    # vt.sampling.SamplerConfig; results depend on the seed (and chunk_problems), not on batch or page sizes
    c.sampling = sampler(
        n=64,  # RECIPE: 64 samples per problem for math
        temperature=1.0,  # RECIPE: temperature 1.0
        top_p=0.95,  # RECIPE: top-p 0.95
        top_k=-1,  # RECIPE: top-k off
        max_new_tokens=65536,  # RECIPE: no extra length cap beyond the context (64K in the report)
        batch_size=256,  # concurrent decode slots
        # on one TPU chip (mesh fsdp 1) the decode kernel holds the page table (slots x pages, int32) in 1 MiB of
        # scalar memory: 256 slots x 2048 pages of 16 tokens are 2 MiB and do not compile (`vt plan`); 128: 256 KiB
        page_size=128,
    )

    c.clr = ml_collections.ConfigDict()
    c.clr.enabled = False  # claim-level reliability test-time scaling (see :clr)
    c.clr.K = 32  # RECIPE: 32 trajectories per problem
    c.clr.M = 5  # RECIPE: 5 claims per trajectory
    c.clr.runs = 8  # RECIPE: mean over 8 independent runs (runs * K <= n)
    c.clr.claim_max_new_tokens = 4096  # not published: claim extraction replies
    c.clr.verify_max_new_tokens = 16384  # not published: each claim's self-verification

    c.logging = logging_section()  # W&B: one run per evaluation, its summary as the run's summary (vt.tracking)

    if variant == "clr":
        c.sampling.n = 256
        c.ks = (1, 4, 16, 64, 256)
        c.maj_ks = (32, 256)
        c.clr.enabled = True
        return c
    if variant == "smoke":
        c.limit = 2
        c.model.preset = "tiny"
        c.model.dtype = "float32"
        c.sampling.n = 4
        c.sampling.max_new_tokens = 8
        c.sampling.batch_size = 8
        c.ks = (1, 2, 4)
        c.maj_ks = (4,)
        c.chunk_problems = 2  # one generate call for both problems
        c.rewards.math.workers = 1
        c.progress = False
        c.clr.enabled = True
        c.clr.K = 2
        c.clr.M = 2
        c.clr.runs = 2
        c.clr.claim_max_new_tokens = 8
        c.clr.verify_max_new_tokens = 8
    return c
