"""SFT stage 1 (RECIPE "Spectrum"): all quality-filtered data, packed, 5 epochs, on Qwen2.5-Coder-3B.

Run (after `vt convert hf-to-orbax Qwen/Qwen2.5-Coder-3B-dir checkpoints/qwen2.5-coder-3b`):

    vt train --config configs/sft_stage1.py --workdir runs/sft_stage1

Smoke test on CPU (tiny model, synthetic task, a few steps):

    vt train --config configs/sft_stage1.py:smoke --workdir /tmp/sft_smoke

Every step directory under runs/sft_stage1/checkpoints/ is a model checkpoint: Diversity-Exploring
Distillation scores them per domain and merges the winners (vt.train.selection, `vt merge`).
"""
import ml_collections

from configs.common import parse_arg, logging_section


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = ml_collections.ConfigDict()
    c.learner = "sft"  # `vt train` runs the SFT learner (vt.train.sft.SftConfig) on this config

    c.model = ml_collections.ConfigDict()
    c.model.preset = "qwen2.5-coder-3b"  # architecture; init_checkpoint's model_config.json takes precedence
    c.model.init_checkpoint = "checkpoints/qwen2.5-coder-3b"  # base model converted with vt convert hf-to-orbax
    c.model.param_dtype = "float32"  # fp32 master weights and AdamW moments
    c.model.dtype = "bfloat16"  # bf16 compute (mixed precision); logits and the loss stay fp32
    c.model.remat_policy = "full"  # recompute each layer in the backward pass: long packed rows fit in memory
    c.model.attention_impl = "auto"  # splash on TPU, cuDNN flash (jax) on NVIDIA GPUs with bf16, xla elsewhere
    c.model.loss_chunk = 512  # positions per loss chunk: live fp32 logits are rows x 512 x vocab, not x seq_len
    c.model.seed = 0  # random init when init_checkpoint is empty
    c.model.lora_rank = 0  # 0: full fine-tuning; > 0: train LoRA adapters of this rank only (vt.model.lora)
    c.model.lora_alpha = 16.0  # the adapters' term is scaled by lora_alpha / lora_rank
    c.model.lora_dropout = 0.0  # dropout on the adapters' input (SFT only; the RL learner refuses it)
    c.model.lora_targets = "q|k|v|o|gate|up|down"  # regex over the projections given adapters

    c.data = ml_collections.ConfigDict()
    c.data.kind = "chat"  # vt.data chat pipeline: chat template, assistant-only loss, first-fit packing
    c.data.train = "data/sft/stage1/*.jsonl"  # quality-filtered chat records (math, code, STEM, chat, IF)
    c.data.eval = "data/sft/heldout.jsonl"  # held-out split for the periodic eval loss
    c.data.tokenizer = "checkpoints/qwen2.5-coder-3b-hf"  # HF tokenizer directory of the base model
    c.data.seq_len = 32768  # packed row length; not published: the base's context, so long traces fit whole
    c.data.global_batch_size = 128  # RECIPE: global batch 128 (packed rows)
    # micro-batches per step; size to memory (rows / accum per micro-batch). 16 (micro-batches of 8 rows of 32K) so
    # the step fits v6e-8's 32 GB chips: `vt plan`, coder-3b: accum 8 is 40.38 GB a chip there (77.86 GB on v5p-8,
    # of 95), accum 16 is 26.23 GB
    c.data.grad_accum_steps = 16
    c.data.num_shards = 8  # logical data shards, 16 rows each per step: the same batches on 1, 2, 4 or 8 hosts
    c.data.num_epochs = 5.0  # RECIPE: 5 epochs; sets train.steps when that is 0
    c.data.seed = 0  # shuffle and packing order
    c.data.overlong = "truncate_right"  # examples longer than seq_len: keep the first seq_len tokens
    c.data.max_skip_rate = 0.05  # fail the run when more than 5% of records are malformed or unusable
    c.data.read_threads = 8  # grain threads that tokenise in parallel
    c.data.eval_batches = 4  # held-out batches per evaluation
    c.data.hard_subset = ml_collections.ConfigDict()
    c.data.hard_subset.pass_rates = ""  # stage 1 trains on everything (stage 2 sets the profiling file)
    c.data.hard_subset.min_trace_tokens = 5000  # stage 2 only: RECIPE "traces of at least 5K tokens"
    c.data.hard_subset.min_error_rate = 0.75  # stage 2 only: reference model errs in >= 75% of rollouts
    c.data.hard_subset.min_rollouts = 8  # stage 2 only: RECIPE profiles with 8 rollouts
    c.data.hard_subset.missing = "error"  # stage 2 only: a prompt missing from the profile is a join bug

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1  # pure data parallel replicas (params replicated)
    c.mesh.fsdp = -1  # all remaining devices: params, grads and optimiser state sharded (ZeRO-3)
    c.mesh.tensor = 1  # tensor parallel over heads / MLP hidden; raise for very long rows

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 5e-5  # RECIPE: peak lr 5e-5
    c.optim.final_lr = 8e-8  # RECIPE: cosine decay to 8e-8
    c.optim.warmup_frac = 0.05  # RECIPE: 5% linear warmup
    c.optim.b1 = 0.9  # not published for SFT: AdamW defaults
    c.optim.b2 = 0.999  # not published for SFT: AdamW defaults
    c.optim.eps = 1e-8  # AdamW epsilon
    c.optim.weight_decay = 0.01  # not published for SFT: the team's RL scripts use 0.01
    c.optim.clip_norm = 1.0  # not published for SFT: the team's RL scripts clip at 1.0

    c.train = ml_collections.ConfigDict()
    c.train.steps = 0  # 0: num_epochs x batches per epoch, counted with one pass over the data at start-up
    c.train.eval_every = 200  # steps between held-out evaluations (and always at the end; 0 = only at the end)
    c.train.peak_flops = 0.0  # per device for MFU; 0 = table of known accelerators (H100/H200: 989e12)
    c.train.progress = True  # tqdm progress bar
    c.train.compilation_cache = ""  # JAX persistent compilation cache directory ("" = off)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 200  # save every N steps: the candidate pool for Diversity-Exploring Distillation
    c.checkpoint.keep = 1000  # keep them all: every periodic checkpoint is a specialist candidate
    c.checkpoint.best_metric = "eval_loss"  # also always keep the lowest eval loss
    c.checkpoint.best_mode = "min"  # lower eval loss is better
    c.checkpoint.async_save = True  # write in the background while training continues
    c.checkpoint.checksum = True  # sha256 seal per step, verified before every restore

    c.logging = logging_section()  # W&B beside TensorBoard: --config.logging.wandb_project=NAME (vt.tracking)

    return smoke(c) if variant == "smoke" else c


def smoke(c):
    """A few steps of the tiny model on the synthetic translation task, on CPU, in seconds."""
    c.model.preset = "tiny"
    c.model.init_checkpoint = ""
    c.model.dtype = "float32"
    c.model.remat_policy = "auto"  # recompute layers (but not attention) at the tiny width: cheaper than keeping them
    c.model.attention_impl = "xla"
    c.data.kind = "synthetic"
    c.data.train = "synthetic"
    c.data.eval = "synthetic"
    c.data.tokenizer = ""
    c.data.seq_len = 64
    c.data.global_batch_size = 8
    c.data.grad_accum_steps = 2
    c.data.num_shards = 4  # 2 rows per shard and step: one per micro-batch; runs on 1, 2 or 4 processes
    c.data.read_threads = 0
    c.data.eval_batches = 2
    c.mesh.fsdp = 1
    c.optim.lr = 3e-3
    c.optim.final_lr = 1e-4
    c.optim.weight_decay = 0.0
    c.train.steps = 6
    c.train.eval_every = 3
    c.checkpoint.every = 3
    c.checkpoint.keep = 2
    return c
