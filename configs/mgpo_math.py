"""MGPO math RL (RECIPE stage 3, first phase) on the merged SFT checkpoint of Qwen2.5-Coder-3B.

Run (after SFT, Diversity-Exploring Distillation and `vt profile` of the starting checkpoint):

    vt train --config configs/mgpo_math.py --workdir runs/mgpo_math

Smoke test on CPU (tiny random model, a few steps through the real sampler and math verifier):

    vt train --config configs/mgpo_math.py:smoke --workdir /tmp/mgpo_smoke

The other RL phases (long2short.py, mgpo_code.py, mgpo_stem.py, instruct_rl.py) start from this file and
change what differs. Sweep: `get_sweep()` below (launch/sweep.py).
"""
from pathlib import Path

import ml_collections

from configs.common import logging_section, opd_section, parse_arg, rewards_section

SMOKE_DATA = Path(__file__).resolve().parent / "smoke_data"


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = ml_collections.ConfigDict()
    c.learner = "rl"  # `vt train` runs the RL learner (vt.rl.learner.RLConfig) on this config

    c.model = ml_collections.ConfigDict()
    c.model.preset = "qwen2.5-coder-3b"  # architecture when init_checkpoint is empty (tests only)
    c.model.init_checkpoint = "runs/sft_merged"  # the merged SFT specialists (Diversity-Exploring Distillation)
    c.model.param_dtype = "float32"  # fp32 master weights: updates of lr 1e-6 vanish in bf16
    c.model.dtype = "bfloat16"  # compute dtype of the learner and the sampler
    c.model.remat_policy = "full"  # long responses: recompute layers in the backward pass
    c.model.attention_impl = "auto"  # splash on TPU, cuDNN flash (jax) on NVIDIA GPUs with bf16, xla elsewhere
    c.model.loss_chunk = 512  # positions per log-prob chunk: live fp32 logits are rows x 512 x vocab, not x seq_len
    c.model.seed = 0  # random init only when init_checkpoint is empty
    c.model.lora_rank = 0  # 0: full fine-tuning; > 0: train LoRA adapters of this rank only (vt.model.lora)
    c.model.lora_alpha = 16.0  # the adapters' term is scaled by lora_alpha / lora_rank
    c.model.lora_dropout = 0.0  # dropout on the adapters' input (SFT only; the RL learner refuses it)
    c.model.lora_targets = "q|k|v|o|gate|up|down"  # regex over the projections given adapters

    c.data = ml_collections.ConfigDict()
    c.data.train = "data/rl/math.parquet"  # prompts with ground truths (verl parquet or JSONL)
    c.data.eval = "data/eval/aime25.parquet"  # held-out prompts for the accuracy curve
    c.data.domain = "math"  # reward for every record: last \boxed{} checked with math-verify
    c.data.tokenizer = "checkpoints/qwen2.5-coder-3b-hf"  # HF tokenizer directory of the base model
    c.data.profile = "runs/profile/math.jsonl"  # `vt profile` of the starting checkpoint: p in {0, 1} dropped
    c.data.max_prompt_tokens = 2048  # longer prompts are a data error, named by record
    c.data.seed = 0  # prompt order

    c.rollout = ml_collections.ConfigDict()
    c.rollout.group_size = 16  # responses per prompt: the team's public scripts
    c.rollout.prompts_per_step = 64  # prompts per RL step: the team's public scripts
    c.rollout.sampler = sampler = ml_collections.ConfigDict()  # vt.sampling.SamplerConfig
    sampler.batch_size = 256  # decode slots; slot refill keeps them busy through the length tail
    sampler.max_new_tokens = 65536 - 2048  # one long window throughout (RECIPE: 64K, no 16K -> 32K curriculum)
    sampler.temperature = 1.0  # on-policy sampling at T = 1 (the learner scores pi at this temperature)
    sampler.top_p = 1.0  # no nucleus truncation during RL (the learner's pi is the full softmax)
    sampler.top_k = -1  # off
    sampler.n = 1  # samples per request: the learner sets its own (rollout.group_size, train.eval_samples)
    sampler.seed = 0  # sampler randomness is a function of (seed, step, request, sample): exact resume
    sampler.stop_token_ids = None  # None: the tokenizer's end-of-sequence ids
    sampler.stop_strings = ()  # none
    sampler.max_context = None  # None: the model's max_position_embeddings
    sampler.steps_per_call = 64  # decode steps per host round trip
    sampler.refill = True  # refill finished slots with waiting prompts
    sampler.refill_min_free = 0  # free slots that end a decode call while prompts wait; 0: max(1, slots / 8)
    sampler.prefill_tokens = 8192  # most (padded prompts x bucket length) per prefill call
    sampler.min_prompt_bucket = 16  # shortest prompt bucket
    sampler.min_prefill_rows = 8  # prefill batches padded to a power of two >= this
    sampler.page_size = 16  # tokens per KV page
    sampler.kv_pages = 0  # KV pool in pages; 0: kv_memory_fraction of the free device memory
    sampler.kv_memory_fraction = 0.5
    sampler.decode_attention = "auto"  # decode kernel: Pallas on TPU, XLA elsewhere; "pallas": also on GPU
    sampler.tools = None  # None: one completion per sample; a vt.sampling.ToolsConfig section: multi-turn tool calls
    c.rollout.stream_rewards = True  # verify each sample as its slot finishes, beside decoding; False: after the batch
    # Staleness bound k: 0 = the synchronous learner; k >= 1 samples the batch of step s + k with policy version s
    # while step s updates (whole groups, truncated importance weight mgpo.is_cap against the behaviour policy).
    c.rollout.max_staleness = 0
    # Devices of the sampler's own sub-mesh (the last n; the learner trains on the others, new weights copied
    # device to device after each update); 0: the sampler shares the learner's devices. One process only.
    c.rollout.sampler_devices = 0

    c.mgpo = ml_collections.ConfigDict()
    c.mgpo.gamma = 1.0  # w(q) = exp(-gamma * D_ME(p || 0.5)); not published; 0 = GRPO
    c.mgpo.eps_low = 0.2  # clip range below 1 (team scripts: 0.2)
    c.mgpo.eps_high = 0.2  # clip range above 1 (team scripts: 0.2)
    c.mgpo.aggregation = "seq_mean"  # RECIPE's J: mean over responses of per-response token means
    c.mgpo.adv_eps = 1e-6  # A = (r - mean) / (std + eps)
    c.mgpo.std_ddof = 1  # unbiased group std, as in verl's GRPO
    c.mgpo.is_cap = 2.0  # truncated importance sampling: min(pi_learner / pi_sampler, C); not published
    c.mgpo.kl_coef = 0.0  # no KL term in the reports
    c.mgpo.long2short_lambda = 0.0  # Long2Short off in this phase (see long2short.py)
    c.mgpo.mini_batches = 1  # one update per batch (team scripts)
    c.mgpo.dynamic_sampling_rounds = 0  # > 0: replace zero-variance groups with fresh prompts, up to N extra rounds
    c.mgpo.tool_call_reward = 0.0  # with the sampler's tools: added to a sample's reward per call it made (< 0: a penalty)

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # replicas
    c.mesh.fsdp = -1  # all remaining devices: ZeRO-3 sharding of params and optimiser state
    c.mesh.tensor = 1  # tensor parallel; raise on long contexts

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6  # team scripts: constant 1e-6
    c.optim.final_lr = 1e-6  # equal to lr: a constant schedule
    c.optim.warmup_frac = 0.0  # no warmup
    c.optim.b1 = 0.9  # AdamW (0.9, 0.999)
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.01  # team scripts
    c.optim.clip_norm = 1.0  # team scripts

    c.train = ml_collections.ConfigDict()
    c.train.steps = 1000  # RL steps; not published: stop on the held-out curve
    c.train.eval_every = 50  # steps between held-out accuracy evaluations (always at start and end; 0 = only those)
    c.train.eval_samples = 8  # avg@8 at the rollout temperature
    c.train.eval_prompts = 64  # held-out prompts per evaluation
    c.train.progress = True  # tqdm progress bar
    c.train.peak_flops = 0.0  # per device for MFU; 0 = table of known accelerators (H100/H200: 989e12)
    c.train.tokens_per_micro_batch = 65536  # row slots per learner forward/backward (all devices); gradients accumulated
    c.train.pack_rows = True  # first-fit pack samples into rows; False: one padded row per sample
    c.train.share_prompts = True  # packed rows hold a group's prompt once, its completions as branches of it
    c.train.compilation_cache = ""  # JAX persistent compilation cache directory ("" = off)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 50  # save every N RL steps
    c.checkpoint.keep = 5  # newest kept
    c.checkpoint.best_metric = "eval_accuracy"  # and the best held-out accuracy
    c.checkpoint.best_mode = "max"
    c.checkpoint.async_save = True  # write while the next rollouts run
    c.checkpoint.checksum = True  # sha256 seal per step, verified on restore

    c.rewards = rewards_section()  # each domain's options (vt.rewards.registry)
    c.rewards.math.workers = 8  # killable math-verify worker processes
    c.opd = opd_section()  # on-policy distillation off: no teacher (configs/opd.py sets one)

    c.logging = logging_section()  # W&B beside TensorBoard: --config.logging.wandb_project=NAME (vt.tracking)

    return smoke(c, "math.jsonl", "math") if variant == "smoke" else c


def smoke(c, data_file: str, domain: str):
    """A tiny random model for a few RL steps on CPU, through the real sampler and verifier."""
    c.model.preset = "tiny"
    c.model.init_checkpoint = ""
    c.model.dtype = "float32"
    c.model.remat_policy = "auto"  # recompute layers (but not attention) at the tiny width: cheaper than keeping them
    c.model.attention_impl = "xla"
    c.data.train = str(SMOKE_DATA / data_file)
    c.data.eval = str(SMOKE_DATA / data_file)
    c.data.domain = domain
    c.data.tokenizer = str(SMOKE_DATA / "tokenizer")
    c.data.profile = ""
    c.rollout.group_size = 4
    c.rollout.prompts_per_step = 4
    c.rollout.sampler.max_new_tokens = 16
    c.rollout.sampler.batch_size = 16
    c.rollout.sampler.steps_per_call = 16
    c.optim.lr = 1e-4
    c.optim.final_lr = 1e-4
    c.train.steps = 2
    c.train.eval_every = 0
    c.train.eval_samples = 2
    c.train.eval_prompts = 4
    c.train.progress = False
    c.checkpoint.every = 2
    c.checkpoint.async_save = False
    for opts in c.rewards.values():
        if "workers" in opts:
            opts.workers = 2
    return c


def get_sweep(arg=None):
    """gamma x lr grid; launch/sweep.py expands it into named runs of --config overrides."""
    return [{"mgpo.gamma": g, "optim.lr": lr, "optim.final_lr": lr} for g in (0.0, 0.5, 1.0, 2.0) for lr in (5e-7, 1e-6)]
