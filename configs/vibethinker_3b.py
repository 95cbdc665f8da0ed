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
    data/eval/...                       benchmark files named by configs/eval_*.py (AIME25 ships in tests/data)

Each stage section is its learner's own config (configs/sft_stage1.py, configs/self_distill.py and
configs/eval_*.py document every field; the RL fields are vt.rl.learner.RLConfig) plus pipeline fields:
`enabled`, and for RL stages `profile_k` (profile the phase's starting checkpoint with k rollouts per prompt
and drop prompts at pass rate 0 or 1, as the RECIPE prescribes before every RL phase; 0 = off). The pipeline
sets the fields that connect stages (model.init_checkpoint, tokenizers, pass-rate files, teacher checkpoints),
so those are left empty here.
"""
import importlib.util
from pathlib import Path

import ml_collections

_HERE = Path(__file__).parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_vt3b_{name}", _HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rl_section(train, domain, steps, *, long2short=0.0, max_new_tokens=65536, eval_data=""):
    """One MGPO phase (RECIPE stage 3/5 and the team's public RL scripts)."""
    c = ml_collections.ConfigDict()
    c.enabled = True
    c.profile_k = 8  # RECIPE: drop prompts the phase's start solves always or never (8 rollouts each)
    c.profile_max_new_tokens = 0  # 0 = rollout.sampler.max_new_tokens
    c.model = ml_collections.ConfigDict()
    c.model.preset = "qwen2.5-coder-3b"  # ignored: the starting checkpoint's model_config.json wins
    c.model.init_checkpoint = ""  # set by the pipeline: the previous stage's checkpoint
    c.model.param_dtype = "float32"
    c.model.dtype = "bfloat16"
    c.model.remat_policy = "full"
    c.model.attention_impl = "jax"
    c.model.seed = 0
    c.data = ml_collections.ConfigDict()
    c.data.train = train  # prompts with verifiable references
    c.data.eval = eval_data  # held-out prompts for the learner's own accuracy curve ("" = none)
    c.data.domain = domain  # reward: math | code | stem | instruct ("" = each record's own domain)
    c.data.tokenizer = ""  # set by the pipeline
    c.data.profile = ""  # set by the pipeline when profile_k > 0
    c.data.max_prompt_tokens = 4096
    c.data.seed = 0
    c.rollout = ml_collections.ConfigDict()
    c.rollout.group_size = 16  # RECIPE / team scripts: G = 16
    c.rollout.prompts_per_step = 64  # 64 prompts per step
    c.rollout.sampler = ml_collections.ConfigDict()  # vt.sampling.SamplerConfig (defaults for the rest)
    c.rollout.sampler.temperature = 1.0
    c.rollout.sampler.top_p = 1.0
    c.rollout.sampler.top_k = -1
    c.rollout.sampler.max_new_tokens = max_new_tokens  # RECIPE: one long 64K window throughout
    c.rollout.sampler.batch_size = 1024  # decode slots
    c.rollout.sampler.steps_per_call = 64
    c.rollout.sampler.seed = 0
    c.mgpo = ml_collections.ConfigDict()
    c.mgpo.gamma = 1.0  # not published; 0 = GRPO
    c.mgpo.eps_low = 0.2
    c.mgpo.eps_high = 0.2
    c.mgpo.aggregation = "seq_mean"
    c.mgpo.adv_eps = 1e-6
    c.mgpo.std_ddof = 1
    c.mgpo.is_cap = 2.0  # truncated importance sampling cap C
    c.mgpo.kl_coef = 0.0  # no KL term in the reports
    c.mgpo.long2short_lambda = long2short  # RECIPE: 0.2 in the Long2Short phase at the end of math RL
    c.mgpo.mini_batches = 1  # one update per batch
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6  # team scripts: constant 1e-6, AdamW (0.9, 0.999), wd 0.01, clip 1.0
    c.optim.final_lr = 1e-6
    c.optim.warmup_frac = 0.0
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.01
    c.optim.clip_norm = 1.0
    c.train = ml_collections.ConfigDict()
    c.train.steps = steps  # not published
    c.train.eval_every = 20
    c.train.eval_samples = 4
    c.train.eval_prompts = 64
    c.train.progress = True
    c.train.tokens_per_micro_batch = 65536  # row slots per learner forward/backward (all devices); gradients accumulated
    c.train.pack_rows = True  # first-fit pack samples into rows; False: one padded row per sample
    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 20
    c.checkpoint.keep = 3
    c.checkpoint.best_metric = ""
    c.checkpoint.best_mode = "max"
    c.checkpoint.async_save = True
    c.checkpoint.checksum = True
    c.rewards = {}  # domain -> reward options, e.g. {"code": {"workers": 32}}
    return c


def get_config(arg=None):
    stage1 = _load("sft_stage1").get_config(None)
    stage2 = _load("sft_stage2").get_config(None)
    distill = _load("self_distill").get_config(None)

    c = ml_collections.ConfigDict()
    c.name = "vibethinker-3b"
    c.base_checkpoint = "checkpoints/qwen2.5-coder-3b"  # vt checkpoint of the base model (SFT stage 1 starts here)
    c.tokenizer = "checkpoints/qwen2.5-coder-3b-hf"  # HF tokenizer directory shared by every stage
    c.compilation_cache = ""  # a JAX persistent compilation cache directory saves recompiles across stages

    c.probe = ml_collections.ConfigDict()  # the held-out accuracy table after each training stage
    c.probe.data = {}  # domain -> prompt file; {} = no table (the eval stage reports the benchmarks)
    c.probe.n = 4
    c.probe.temperature = 1.0
    c.probe.top_p = 0.95
    c.probe.max_new_tokens = 32768
    c.probe.batch_size = 256
    c.probe.limit = 64
    c.probe.seed = 0

    s = c.stages = ml_collections.ConfigDict()
    s.sft1 = stage1
    s.sft1.enabled = True
    s.sft1.model.init_checkpoint = ""  # the pipeline sets base_checkpoint

    s.profile = ml_collections.ConfigDict()
    s.profile.enabled = True
    s.profile.data = ""  # "" = sft1's training prompts (one per prompt_id)
    s.profile.k = 8  # RECIPE: 8 rollouts
    s.profile.max_new_tokens = 32768
    s.profile.temperature = 1.0
    s.profile.top_p = 1.0
    s.profile.batch_size = 1024
    s.profile.prompts_per_call = 256
    s.profile.seed = 0
    s.profile.limit = 0

    s.sft2 = stage2
    s.sft2.enabled = True
    s.sft2.model.init_checkpoint = ""  # the pipeline: sft1's final checkpoint
    s.sft2.data.hard_subset.pass_rates = ""  # the pipeline: profile/pass_rates.jsonl

    s.select = ml_collections.ConfigDict()
    s.select.enabled = True
    s.select.pools = ("sft2",)  # candidates: stage 2's periodic checkpoints (add "sft1" to pool both stages)
    s.select.probes = {"math": "data/probe/math.jsonl", "code": "data/probe/code.jsonl",
                       "stem": "data/probe/stem.jsonl"}
    s.select.n = 16
    s.select.k = 8  # pass@8 per domain picks the specialist
    s.select.temperature = 1.0
    s.select.top_p = 0.95
    s.select.max_new_tokens = 32768
    s.select.batch_size = 512
    s.select.limit = 128
    s.select.seed = 0

    s.rl_math = rl_section("data/rl/math.parquet", "math", 400, eval_data="tests/data/aime25.parquet")
    s.long2short = rl_section("data/rl/math.parquet", "math", 100, long2short=0.2)
    s.rl_code = rl_section("data/rl/code.jsonl", "code", 300)
    s.rl_code.rewards = {"code": {"workers": 32}}
    s.rl_stem = rl_section("data/rl/stem.jsonl", "stem", 200)
    s.rl_instruct = rl_section("data/rl/instruct.jsonl", "instruct", 200)

    s.self_distill = ml_collections.ConfigDict()
    s.self_distill.enabled = True
    s.self_distill.distill = distill
    for d, path in (("math", "data/rl/math.parquet"), ("code", "data/rl/code.jsonl"), ("stem", "data/rl/stem.jsonl")):
        src = distill.sources[d]
        src.ckpt = ""  # the pipeline: that domain's RL checkpoint (math: after Long2Short)
        src.data = path
    distill.student = ""  # the pipeline: the checkpoint before this stage (after STEM RL)
    distill.tokenizer = ""
    s.self_distill.sft = _load("sft_stage1").get_config(None)
    s.self_distill.sft.data.train = ""  # the pipeline: self_distill/distill/selected.jsonl
    s.self_distill.sft.data.eval = ""
    s.self_distill.sft.data.num_epochs = 1.0  # not published
    s.self_distill.sft.model.init_checkpoint = ""

    s.eval = ml_collections.ConfigDict()
    s.eval.enabled = True
    s.eval.benchmarks = {name: _load(f"eval_{name}").get_config(None) for name in ("aime25", "lcb", "gpqa", "ifeval")}

    s.export = ml_collections.ConfigDict()
    s.export.enabled = True
    s.export.dtype = "bfloat16"
    s.export.check_transformers = False  # a 3B greedy comparison on CPU takes a while: opt in
    s.export.check_prompts = 4
    s.export.check_max_new_tokens = 64

    if arg in (None, ""):
        return c
    raise ValueError(f"unknown variant {arg!r}; known: (none)")
