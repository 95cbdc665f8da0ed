"""The demo: configs/vibethinker_3b.py stage for stage, on the `tiny` Qwen2 preset trained from scratch on the
built-in synthetic verifiable tasks (vt.data.tasks: arithmetic with a worked step and a boxed answer, Python
functions graded by unit tests in the bubblewrap sandbox, multiple-choice "largest option", bullet lists under
count and case constraints), with a byte-level BPE tokenizer (Qwen2's pipeline) trained on that corpus. CPU, about 10 minutes:

    make demo                     # = vt demo  (workdir demo_out/)
    vt demo --variant ci          # shorter: the CI test runs it
    vt pipeline --config configs/demo.py --workdir demo_out      # the same thing through the general runner
    vt demo --variant tools       # tool-integrated reasoning: SFT on python-tool traces, then RL with the tool
    vt demo --variant opd         # the full demo, then on-policy distillation: the final model teaches SFT-1's

The SFT teacher is deliberately noisy (`stages.data.noise` of its answers are wrong), so SFT reaches a
middling accuracy that RL then raises; every number below is a demo-size stand-in for the 3B value.
"""
import ml_collections

from configs import eval_demo_tasks, sft_stage1, vibethinker_3b
from configs.common import parse_arg, rewards_section

DOMAINS = ("math", "code", "stem", "instruct")
DATA = "{workdir}/data"


def _tiny_sft(c, steps, lr, every, keep=10):
    c.model.preset = "tiny"
    c.model.dtype = "float32"
    c.model.remat_policy = "auto"  # recompute layers (but not attention) at the tiny width: cheaper than keeping them
    c.model.attention_impl = "xla"
    c.data.train = f"{DATA}/sft.jsonl"
    c.data.eval = f"{DATA}/sft_heldout.jsonl"
    c.data.seq_len = 128
    c.data.global_batch_size = 16
    c.data.grad_accum_steps = 1
    c.data.read_threads = 0
    c.data.eval_batches = 2
    c.mesh.fsdp = 1
    c.optim.lr = lr
    c.optim.final_lr = lr / 30
    c.optim.weight_decay = 0.0
    c.train.steps = steps
    c.train.eval_every = 0
    c.train.progress = True  # the stage's progress bar (the pipeline prints a line as each stage starts and ends)
    c.checkpoint.every = every
    c.checkpoint.keep = keep
    c.checkpoint.best_metric = ""
    c.checkpoint.async_save = False
    return c


def _tiny_rl(c, domain, steps, *, prompts=16, group=8, lr=3e-4):
    c.profile_k = 4  # RECIPE: 8; fewer rollouts keep the demo short
    c.model.dtype = "float32"
    c.model.remat_policy = "auto"  # recompute layers (but not attention) at the tiny width: cheaper than keeping them
    c.model.attention_impl = "xla"
    c.data.train = f"{DATA}/rl_{domain}.jsonl"
    c.data.eval = ""  # the pipeline's held-out table measures every stage the same way
    c.rollout.group_size = group
    c.rollout.prompts_per_step = prompts
    c.rollout.sampler.max_new_tokens = 40
    c.rollout.sampler.batch_size = 128
    c.rollout.sampler.steps_per_call = 40
    c.mesh.fsdp = 1
    c.optim.lr = lr
    c.optim.final_lr = lr
    c.optim.weight_decay = 0.0
    c.train.steps = steps
    c.train.eval_every = 0
    c.train.progress = True  # the stage's progress bar (the pipeline prints a line as each stage starts and ends)
    c.checkpoint.every = 5
    c.checkpoint.keep = 2
    c.checkpoint.async_save = False
    c.rewards = rewards_section()  # every domain at its defaults
    return c


def get_config(arg=None):
    variant = parse_arg(arg, "ci", "opd", "tools")
    c = vibethinker_3b.get_config(None)
    c.name = "demo"
    c.base_checkpoint = ""  # trained from scratch: sft1 starts from a random `tiny` model
    c.tokenizer = f"{DATA}/tokenizer"  # a byte-level BPE (Qwen2's pipeline) directory, trained by the data stage
    c.compilation_cache = "{workdir}/.jax_cache"

    c.probe.data = {d: f"{DATA}/heldout_{d}.jsonl" for d in DOMAINS}
    c.probe.limit = 32
    c.probe.sampler.n = 4
    c.probe.sampler.temperature = 1.0
    c.probe.sampler.top_p = 1.0
    c.probe.sampler.max_new_tokens = 40
    c.probe.sampler.batch_size = 128

    s = c.stages
    s.data = ml_collections.ConfigDict()
    s.data.enabled = True
    s.data.out = DATA
    s.data.seed = 0
    s.data.domains = DOMAINS
    s.data.noise = 0.4
    s.data.sft_per_domain = 600
    s.data.rl_per_domain = 96
    s.data.heldout_per_domain = 64
    s.data.probe_per_domain = 16
    s.data.vocab_size = 512  # = the tiny preset's vocabulary: every id the model can sample decodes

    _tiny_sft(s.sft1, steps=300, lr=3e-3, every=100)
    s.profile.sampler.n = 8
    s.profile.sampler.max_new_tokens = 40
    s.profile.sampler.batch_size = 128
    s.profile.prompts_per_call = 64
    s.profile.limit = 192

    _tiny_sft(s.sft2, steps=100, lr=1e-3, every=25)
    s.sft2.data.hard_subset.min_trace_tokens = 0  # the demo's traces are short; 5K tokens on real data
    s.sft2.data.hard_subset.min_error_rate = 0.25  # demo: prompts the reference misses at least 2 of 8 times
    s.sft2.data.hard_subset.missing = "exclude"  # only the first profile.limit prompts were profiled

    s.select.probes = {d: f"{DATA}/probe_{d}.jsonl" for d in DOMAINS}
    s.select.k = 4
    s.select.limit = 16
    s.select.sampler.n = 8
    s.select.sampler.top_p = 1.0
    s.select.sampler.max_new_tokens = 40
    s.select.sampler.batch_size = 128

    _tiny_rl(s.rl_math, "math", 16)
    _tiny_rl(s.long2short, "math", 8)
    _tiny_rl(s.rl_code, "code", 10, prompts=8)
    _tiny_rl(s.rl_stem, "stem", 12)
    _tiny_rl(s.rl_instruct, "instruct", 12)
    _tiny_rl(s.opd, "instruct", 16, group=4)  # off but for the opd variant (opd_variant)
    s.opd.profile_k = 0  # every prompt teaches: the teacher's signal needs no mixed pass rate

    d = s.self_distill.distill
    d.dtype = "float32"
    d.mesh.fsdp = 1
    for dom in ("math", "code", "stem"):
        d.sources[dom].data = f"{DATA}/rl_{dom}.jsonl"
        d.sources[dom].n = 4
        d.sources[dom].limit = 32
    d.sampling.top_p = 1.0
    d.sampling.max_new_tokens = 40
    d.sampling.batch_size = 128
    d.scoring.chunk_tokens = 0
    d.scoring.min_bucket = 64
    d.scoring.batch_size = 64
    for dom in ("math", "code", "stem"):
        d.selection.rules[dom].min_tokens = 4
        d.selection.rules[dom].length_edges = (16,)
    d.progress = False
    _tiny_sft(s.self_distill.sft, steps=40, lr=5e-4, every=40, keep=1)
    s.self_distill.sft.data.eval = ""

    for name in list(s.eval.benchmarks.keys()):
        del s.eval.benchmarks[name]
    for dom in DOMAINS:
        b = eval_demo_tasks.get_config(dom)  # the same evaluation README's "After the demo" runs by hand
        b.data = f"{DATA}/heldout_{dom}.jsonl"
        b.progress = False
        s.eval.benchmarks[f"demo_{dom}"] = b

    s.export.dtype = "float32"
    s.export.check_transformers = True
    s.export.check_prompts = 8
    s.export.check_max_new_tokens = 40

    return ci(c) if variant == "ci" else opd_variant(c) if variant == "opd" else tools_variant(c) if variant == "tools" \
        else c


def tools_variant(c):
    """Tool-integrated reasoning (issue 52): products of two 2-digit numbers (vt.data.tasks.tool_record), which the
    tiny model cannot work out in its head but can copy from the `python` tool's output. SFT-1 on traces that call
    the tool (half of them instead guess at once: wrong), then RL with the sampler's tools on (a sample parks at
    `</tool_call>`, the call runs in the sandbox, the tool's turn is appended; the learner trains on the policy's
    tokens only). The held-out table (with tools) says the accuracy and the share of samples that called the tool
    without an error turn after each stage; the eval stage gives pass@k with tools. Only data, sft1, rl_math and
    eval run. SFT-1 runs 800 steps: copying the operands into the call and the tool's output into the answer is
    learnt suddenly, between steps ~400 and ~700 (teacher-forced, all digits right on held-out traces: 0.11 at
    step 400, 0.57 at 600, 0.80 at 800; with 3-digit numbers 0.00 at 400 and 0.36 at 800, and the demo's former
    400-step SFT-1 on them left accuracy 0.000). Measured (2026-12-06, CPU at load 10-15): sft1 accuracy 0.414,
    0.516 of samples call the tool without an error (287 s); rl_math (16 steps, 162 s) 0.703 and 0.891; eval
    pass@1 73.4%, pass@4 93.8%, tool_call_share 0.875; 522 s in all, fresh, at load ~7-12
    (tests/rl/test_tool_learning.py asserts the rise over two seeds, and no rise without the tool)."""
    s = c.stages
    for name in ("profile", "sft2", "select", "long2short", "rl_code", "rl_stem", "self_distill", "rl_instruct",
                 "export"):
        s[name].enabled = False
    tools = {"max_turns": 2, "max_tool_output_tokens": 32, "timeout_s": 5.0, "workers": 8}
    s.data.domains = ("tools",)
    s.data.noise = 0.5  # half the SFT traces guess instead of calling the tool
    s.data.sft_per_domain = 2000
    s.data.rl_per_domain = 256
    s.sft1.data.seq_len = 128  # a trace: ~90 tokens
    s.sft1.train.steps = 800
    c.probe.data = {"math": f"{DATA}/heldout_tools.jsonl"}  # graded by the math verifier: \boxed{a*b}
    c.probe.sampler.tools = tools
    c.probe.sampler.max_new_tokens = 96  # a call, the tool's turn and the answer
    r = s.rl_math
    r.profile_k = 0
    r.data.train = f"{DATA}/rl_tools.jsonl"
    r.data.domain = "math"
    r.rollout.sampler.tools = tools
    r.rollout.sampler.max_new_tokens = 96
    r.rollout.sampler.steps_per_call = 32
    r.train.steps = 16
    for name in list(s.eval.benchmarks.keys()):
        del s.eval.benchmarks[name]
    b = eval_demo_tasks.get_config("math")
    b.name, b.data, b.progress = "demo_tools", f"{DATA}/heldout_tools.jsonl", False
    b.sampling.tools = tools
    b.sampling.max_new_tokens = 96
    s.eval.benchmarks["demo_tools"] = b
    return c


def opd_variant(c):
    """On-policy distillation after the full demo: the demo's final model (rl_instruct's) teaches a fresh student,
    the SFT-1 checkpoint, on the instruction prompts (bullet lists of a given count and letter case: several
    constrained tokens per answer, where the teacher is clearly ahead: 0.77 vs 0.50 held-out). opd: 16 steps of 16
    prompts x 4 samples, each sampled token scored by the teacher, the verifiable reward mixed in
    (opd.reward_coef = 1; lr 3e-4, the RL stages'); opd_sft, its baseline: the same student SFT'd on the teacher's
    own samples of the same prompts, as many teacher tokens (lr 1e-3, sft2's). Both measure held-out accuracy (all
    constraints met; 64 prompts x 32 samples at T=1, the RL learner's measure) after every step against the
    teacher tokens spent so far; the report prints both curves, the teacher's accuracy (measured alike) and the
    tokens each arm needed to come within 0.05 of it, and plots them on one axis.
    Measured 2026-12-06 (CPU, quiet box), seeds 0 / 1: teacher 0.772 / 0.781; within 0.05 of it after OPD 3,285 /
    3,280 teacher tokens (0.500 -> 0.817 / 0.508 -> 0.801 by ~10.3k), SFT on the teacher's samples 9,143 / 7,248
    (0.503 -> 0.728 / 0.478 -> 0.828 by ~11k: it learns the teacher's wrong samples too and dips on the way).
    What each part adds, same seeds: pure OPD (reward_coef 0) reached it at 4,586 tokens in seed 0 and not within
    16 steps in seed 1 (0.726 at best: level with SFT); the reward alone (kl_coef 0) after 8 / 7 steps, OPD with
    it after 5 / 5. On the demo's arithmetic (one answer digit decides; teacher 0.680) neither arm came within
    0.05 in 144 OPD steps (~125k tokens): OPD 0.379 -> 0.629 at best, SFT 0.326 -> 0.633 at 125,549."""
    o = c.stages.opd
    o.enabled = True
    o.start_from = "sft1"
    o.opd.teacher = "rl_instruct"
    o.opd.teacher_dtype = "float32"  # the demo's models are fp32
    o.opd.reward_coef = 1.0
    o.data.domain = "instruct"  # the base recipe's opd stage distills math
    o.data.eval = f"{DATA}/heldout_instruct.jsonl"
    o.train.steps = 16
    o.train.eval_every = 1
    o.train.eval_prompts = 64
    o.train.eval_samples = 32  # 2,048 samples: +-0.01 of sampling noise (the curves' steps are ~0.03)
    # Its baseline: sft1 SFT'd on rl_instruct's own samples of the same prompts, as many teacher tokens as OPD's
    # teacher scored, held-out accuracy measured as the opd stage measures it (vt.recipe.stages.run_opd_sft).
    a = c.stages.opd_sft
    a.enabled = True
    a.samples_per_prompt = 4
    a.eval_every = 1  # SFT steps of ~650 teacher tokens, as an opd step's
    a.seed = 0
    a.sft = _tiny_sft(sft_stage1.get_config(None), steps=1, lr=1e-3, every=2)  # sft2's rate; steps: one epoch
    a.sft.optim.final_lr = 1e-3  # constant, as OPD's: a point of the curve does not depend on where the epoch ends
    a.sft.data.eval = ""
    return c


def ci(c):
    """Shorter: fewer steps and prompts everywhere (the CI test, and the kill -9 / resume test)."""
    s = c.stages
    s.data.sft_per_domain = 300
    s.data.rl_per_domain = 48
    c.probe.limit = 16
    s.sft1.train.steps = 200
    s.sft1.checkpoint.every = 100
    s.profile.limit = 64
    s.sft2.train.steps = 40
    s.sft2.checkpoint.every = 20
    s.select.limit = 8
    s.select.sampler.n = 4
    s.select.k = 2
    for name, steps in (("rl_math", 8), ("long2short", 4), ("rl_code", 4), ("rl_stem", 6), ("rl_instruct", 6)):
        s[name].train.steps = steps
        s[name].checkpoint.every = 2
        s[name].rollout.prompts_per_step = 8
    for dom in ("math", "code", "stem"):
        s.self_distill.distill.sources[dom].limit = 16
    s.self_distill.sft.train.steps = 20
    s.self_distill.sft.checkpoint.every = 20
    for b in s.eval.benchmarks.values():
        b.limit = 16
    s.export.check_prompts = 4
    return c
