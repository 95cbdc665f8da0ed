"""The whole VibeThinker-3B recipe (RECIPE.md), stage after stage, on Qwen2.5-Coder-3B.

Check every input and every stage config without running anything (prints each missing path):

    vt pipeline --config configs/vibethinker_3b.py --workdir runs/vibethinker --validate

Run (re-running skips finished stages and resumes an interrupted one; `--from STAGE`, `--only STAGE`):

    vt pipeline --config configs/vibethinker_3b.py --workdir runs/vibethinker

What a user must supply (paths relative to where vt runs; override any with --config.KEY=VALUE):
    checkpoints/qwen2.5-coder-3b        `vt convert hf-to-orbax <Qwen2.5-Coder-3B HF dir> checkpoints/qwen2.5-coder-3b`
    checkpoints/qwen2.5-coder-3b-hf     the HF directory itself (its tokenizer is used by every stage)
    data/sft/stage1/*.jsonl             chat records with full reasoning traces (math, code, STEM, chat, IF);
                                        several traces of one query share a `prompt_id`
    data/sft/heldout.jsonl              held-out chat records (eval loss)
    data/probe/{math,code,stem}.jsonl   per-domain probing prompts with references (Pass@K selection)
    data/rl/{math.parquet,code,stem,instruct}.jsonl   RL prompts with ground truth / unit tests / constraints
    data/eval/...                       benchmark files named by configs/eval_*.py (AIME25 ships in tests/assets)

Each stage section starts from that stage's own config file (configs/sft_stage1.py, sft_stage2.py,
mgpo_math.py, long2short.py, mgpo_code.py, mgpo_stem.py, instruct_rl.py, self_distill.py and eval_*.py document
every field) and changes what the recipe runs differently, plus pipeline fields (vt.recipe.stages): `enabled`,
and for RL stages `profile_k` (profile the phase's starting checkpoint with k rollouts per prompt and drop
prompts at pass rate 0 or 1, as the RECIPE prescribes before every RL phase; 0 = off). The pipeline sets the
fields that connect stages (model.init_checkpoint, tokenizers, pass-rate files, teacher checkpoints), so those
are left empty here. Sampler sections are vt.sampling.SamplerConfig (configs/common.sampler).
"""
import ml_collections

from configs import (eval_aime25, eval_gpqa, eval_ifeval, eval_lcb, instruct_rl, long2short, mgpo_code, mgpo_math,
                     mgpo_stem, opd, self_distill, sft_stage1, sft_stage2)
from configs.common import parse_arg, sampler, logging_section


def rl_stage(c, domain, train, steps, *, eval_data=""):
    """One MGPO phase (RECIPE stage 3/5): its stage config `c` plus the pipeline's fields and the recipe's sizes."""
    c.enabled = True
    c.profile_k = 8  # RECIPE: drop prompts the phase's start solves always or never (8 rollouts each)
    c.profile_max_new_tokens = 0  # 0 = rollout.sampler.max_new_tokens
    c.model.init_checkpoint = ""  # set by the pipeline: the previous stage's checkpoint
    c.data.train = train  # prompts with verifiable references
    c.data.eval = eval_data  # held-out prompts for the learner's own accuracy curve ("" = none)
    c.data.domain = domain  # reward: math | code | stem | instruct
    c.data.tokenizer = ""  # set by the pipeline
    c.data.profile = ""  # set by the pipeline when profile_k > 0
    c.data.max_prompt_tokens = 4096
    c.rollout.sampler.max_new_tokens = 65536  # RECIPE: one long 64K window throughout
    c.rollout.sampler.batch_size = 1024  # decode slots
    # KV pages of 128 tokens: the TPU decode kernel holds a device's page table (its slots x pages a slot, int32)
    # in 1 MiB of scalar memory; 256 slots a chip x 2048 pages of 16 tokens is 2 MiB and does not compile
    # (`vt plan --topology v5p-8`); 256 pages of 128 are 256 KiB
    c.rollout.sampler.page_size = 128
    c.train.steps = steps  # not published
    c.train.eval_every = 20
    c.train.eval_samples = 4
    c.checkpoint.every = 20
    c.checkpoint.keep = 3
    c.checkpoint.best_metric = ""
    return c


def one_device():
    """The mesh of a sampler-only stage (profile, select, the probe table): the checkpoint loaded onto one device of
    this host (vt.recipe.stages' default); fsdp=-1 shards it and the KV pool over all of them (see `v5e8`)."""
    return ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})


def get_config(arg=None):
    variant = parse_arg(arg, "v5e8")
    c = ml_collections.ConfigDict()
    c.name = "vibethinker-3b"
    c.base_checkpoint = "checkpoints/qwen2.5-coder-3b"  # vt checkpoint of the base model (SFT stage 1 starts here)
    c.tokenizer = "checkpoints/qwen2.5-coder-3b-hf"  # HF tokenizer directory shared by every stage
    c.compilation_cache = ""  # a JAX persistent compilation cache directory saves recompiles across stages
    # W&B for the whole pipeline: one run per stage (named <name>/<stage>), grouped by work directory; a stage's
    # own logging section, when it names a project, wins.
    c.logging = logging_section()

    c.probe = ml_collections.ConfigDict()  # the held-out accuracy table after each training stage
    c.probe.data = {}  # domain -> prompt file; {} = no table (the eval stage reports the benchmarks)
    c.probe.limit = 64  # prompts per domain (0 = all)
    c.probe.sampler = sampler(n=4, temperature=1.0, top_p=0.95, max_new_tokens=32768, batch_size=256,
                              page_size=128)  # avg@n; one chip: pages of 128 keep its TPU page table in 256 KiB
    c.probe.mesh = one_device()

    s = c.stages = ml_collections.ConfigDict()
    s.sft1 = sft_stage1.get_config(None)
    s.sft1.enabled = True
    s.sft1.model.init_checkpoint = ""  # the pipeline sets base_checkpoint

    s.profile = ml_collections.ConfigDict()
    s.profile.enabled = True
    s.profile.data = ""  # "" = sft1's training prompts (one per prompt_id)
    s.profile.prompts_per_call = 256
    s.profile.limit = 0  # profile only the first N distinct prompts (0 = all)
    # RECIPE: 8 samples. 64 slots: profile samples on one chip with pages of 16 tokens (vt.rl.profile), whose TPU
    # decode kernel holds the page table in 1 MiB of scalar memory (1024 slots x 2048 pages: 8 MiB, does not compile;
    # 64: 512 KiB); that chip's KV pool holds ~70 full-length traces at once anyway (`vt plan --topology v5p-8`)
    s.profile.sampler = sampler(n=8, max_new_tokens=32768, temperature=1.0, top_p=1.0, batch_size=64)
    s.profile.mesh = one_device()

    s.sft2 = sft_stage2.get_config(None)
    s.sft2.enabled = True
    s.sft2.model.init_checkpoint = ""  # the pipeline: sft1's final checkpoint
    s.sft2.data.hard_subset.pass_rates = ""  # the pipeline: profile/pass_rates.jsonl

    s.select = ml_collections.ConfigDict()
    s.select.enabled = True
    s.select.pools = ("sft2",)  # candidates: stage 2's periodic checkpoints (add "sft1" to pool both stages)
    s.select.probes = {"math": "data/probe/math.jsonl", "code": "data/probe/code.jsonl",
                       "stem": "data/probe/stem.jsonl"}
    s.select.k = 8  # pass@8 per domain picks the specialist
    s.select.limit = 128  # probes per domain (0 = all)
    # one chip: pages of 128 tokens keep its TPU decode kernel's page table in 512 KiB (16-token pages: 4 MiB, does
    # not compile; `vt plan --topology v5p-8`)
    s.select.sampler = sampler(n=16, temperature=1.0, top_p=0.95, max_new_tokens=32768, batch_size=512,
                               page_size=128)
    s.select.mesh = one_device()

    s.rl_math = rl_stage(mgpo_math.get_config(None), "math", "data/rl/math.parquet", 400,
                         eval_data="tests/assets/aime25.parquet")
    s.long2short = rl_stage(long2short.get_config(None), "math", "data/rl/math.parquet", 100)
    s.rl_code = rl_stage(mgpo_code.get_config(None), "code", "data/rl/code.jsonl", 300)
    s.rl_code.rewards.code.workers = 32
    s.rl_stem = rl_stage(mgpo_stem.get_config(None), "stem", "data/rl/stem.jsonl", 200)
    s.rl_instruct = rl_stage(instruct_rl.get_config(None), "instruct", "data/rl/instruct.jsonl", 200)
    # On-policy distillation (configs/opd.py), off: enable with a teacher (a checkpoint, an http(s) endpoint or an
    # earlier stage's name) and the stage the student starts from ("" = the last trained before it)
    s.opd = rl_stage(opd.get_config(None), "math", "data/rl/math.parquet", 200)
    s.opd.enabled = False
    s.opd.profile_k = 0  # every prompt teaches: the teacher's signal needs no mixed pass rate
    s.opd.start_from = ""
    s.opd.opd.teacher = "rl_instruct"
    # OPD's baseline, off: the opd stage's student SFT'd on its (checkpoint) teacher's own samples of the opd
    # prompts, as many teacher tokens as the opd stage's teacher scored, held-out accuracy measured alike
    s.opd_sft = ml_collections.ConfigDict()
    s.opd_sft.enabled = False
    s.opd_sft.samples_per_prompt = 4
    s.opd_sft.eval_every = 10
    s.opd_sft.seed = 0
    s.opd_sft.sft = sft_stage1.get_config(None)
    s.opd_sft.sft.data.train = ""  # the pipeline: opd_sft/teacher_samples.jsonl, one epoch
    s.opd_sft.sft.data.eval = ""
    s.opd_sft.sft.model.init_checkpoint = ""  # the pipeline: the opd stage's student

    s.self_distill = ml_collections.ConfigDict()
    s.self_distill.enabled = True
    s.self_distill.distill = distill = self_distill.get_config(None)
    for d, path in (("math", "data/rl/math.parquet"), ("code", "data/rl/code.jsonl"), ("stem", "data/rl/stem.jsonl")):
        src = distill.sources[d]
        src.ckpt = ""  # the pipeline: that domain's RL checkpoint (math: after Long2Short)
        src.data = path
    distill.student = ""  # the pipeline: the checkpoint before this stage (after STEM RL)
    distill.tokenizer = ""
    s.self_distill.sft = sft_stage1.get_config(None)
    s.self_distill.sft.data.train = ""  # the pipeline: self_distill/distill/selected.jsonl
    s.self_distill.sft.data.eval = ""
    s.self_distill.sft.data.num_epochs = 1.0  # not published
    s.self_distill.sft.model.init_checkpoint = ""

    s.eval = ml_collections.ConfigDict()
    s.eval.enabled = True
    s.eval.benchmarks = {"aime25": eval_aime25.get_config(None), "lcb": eval_lcb.get_config(None),
                         "gpqa": eval_gpqa.get_config(None), "ifeval": eval_ifeval.get_config(None)}

    s.export = ml_collections.ConfigDict()
    s.export.enabled = True
    s.export.dtype = "bfloat16"
    s.export.check_transformers = False  # a 3B greedy comparison on CPU takes a while: opt in
    s.export.check_prompts = 4
    s.export.check_max_new_tokens = 64
    return v5e8(c) if variant == "v5e8" else c


def v5e8(c):
    """The recipe on a v5e-8 (8 chips of 16 GB): `vt plan --config configs/vibethinker_3b.py --topology v5e-8` finds
    these stages too big as configured and prints these changes as ones that fit (each compiled); `:v5e8` is checked
    by running it again with them (README, "Sizing a run before launching it")."""
    s = c.stages
    # profile, select, the probe table and eval load the fp32 checkpoint (12.3 GB) onto one chip: 20-23 GB with
    # their KV pool and buffers. Sharded over the host's 8 chips (the weights and the KV pool): 10.17 / 10.95 GB.
    for section in (s.profile, s.select, c.probe):
        section.mesh.fsdp = -1
    for bench in s.eval.benchmarks.values():
        bench.model.mesh.fsdp = -1
    # SFT: 18.84 GB; no single change fits (tensor=2 with twice the accumulation 21.36 GB, rows of 16K 21.24, LoRA
    # alone neither): all together 14.72 GB. A heavy change: LoRA adapters instead of full fine-tuning, traces over
    # 16K tokens cut (data.overlong).
    for sft in (s.sft1, s.sft2, s.self_distill.sft):
        sft.mesh.tensor = 2
        sft.data.seq_len //= 2
        sft.data.global_batch_size *= 2  # as many tokens a batch
        sft.data.grad_accum_steps *= 2  # as many tokens a micro-batch
        sft.model.lora_rank = 64
    # RL: the update on rows of 32K, one a chip, needs 22.61 GB; no single change fits (tensor=2 18.19 GB, rows of
    # 16K neither): all together 8.00 GB. Also heavy: LoRA, responses cut at 12,288 tokens.
    for name in ("rl_math", "long2short", "rl_code", "rl_stem", "rl_instruct"):
        s[name].mesh.tensor = 2
        s[name].model.lora_rank = 64
        s[name].rollout.sampler.max_new_tokens = 16384 - s[name].data.max_prompt_tokens
    return c
