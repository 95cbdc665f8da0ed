"""The VibeThinker-1.5B recipe (RECIPE.md; arXiv 2511.06221) on its base, Qwen2.5-Math-1.5B: the 3B pipeline
(configs/vibethinker_3b.py) with the 1.5B report's differences.

Check every input and every stage config without running anything:

    vt pipeline --config configs/vibethinker_1p5b.py --workdir runs/vibethinker-1.5b --validate

Run (re-running skips finished stages and resumes an interrupted one):

    vt pipeline --config configs/vibethinker_1p5b.py --workdir runs/vibethinker-1.5b

The base, converted with its context raised (see "Context extension"):

    vt convert hf-to-orbax <Qwen2.5-Math-1.5B HF dir> checkpoints/qwen2.5-math-1.5b --max-position-embeddings 32768

and the HF directory itself at checkpoints/qwen2.5-math-1.5b-hf (its tokenizer is Qwen2.5's). The data inputs are
configs/vibethinker_3b.py's. The same pipeline runs on any supported model by pointing it at that model's
checkpoint, e.g. Qwen3-4B: `--config.base_checkpoint=checkpoints/qwen3-4b --config.tokenizer=checkpoints/qwen3-4b-hf`
(the architecture is the checkpoint's model_config.json; every stage's `model.preset` is read only when
base_checkpoint is empty, a random init).

What differs from the 3B recipe, and why:
- Base: Qwen2.5-Math-1.5B (vt preset "qwen2.5-math-1.5b": Qwen2.5-1.5B's shape, rope_theta 1e4, 4,096 positions).
- Context extension. RECIPE.md: the 3B model uses one long window throughout, "no progressive 16K->32K for the 3B
  model", i.e. the 1.5B model's RL window grows from 16K to 32K. A stated choice for the base's 4K context: rope_theta
  stays 1e4 (the frequencies the weights were trained with) and only the recorded context grows, to 32,768, at
  conversion; SFT on packed 32K rows then teaches the long positions. DeepSeek-R1-Distill-Qwen-1.5B did the same
  to the same base (its config.json: rope_theta 10000, max_position_embeddings 131072).
- RL: math at a 16K response window (rl_math), then math at 32K. The runner's stage table has one plain math phase
  and one after it, long2short (RECIPE: Long2Short ends math RL; the runner requires its lambda > 0): the 32K phase
  runs there, with Long2Short's shaping, a stated choice. Then code RL. STEM RL, offline self-distillation and
  instruct RL are 3B additions: present but disabled (set `enabled` to run them).
- Expert fusion: a uniform average of the per-domain Pass@K specialists (RECIPE: "the 1.5B report: uniform
  average"), over both SFT stages' checkpoints.
- Evaluation: the code benchmark at temperature 0.6 (RECIPE: the 1.5B work's code evals); every sampling length
  fits the 32K context (prompt budget 2,048 tokens).
Everything else (learning rates, batch sizes, epochs, MGPO) is the 3B file's: the reports give no other numbers.
"""
from configs import vibethinker_3b
from configs.common import parse_arg

CONTEXT = 32768  # max_position_embeddings the base is converted with (see the docstring)
PROMPT_BUDGET = 2048  # tokens left for prompts under every sampling length
WINDOW_16K, WINDOW_32K = 16384, CONTEXT - PROMPT_BUDGET  # the RL response windows, phase 1 and 2


def get_config(arg=None):
    parse_arg(arg)
    c = vibethinker_3b.get_config(None)
    c.name = "vibethinker-1.5b"
    c.base_checkpoint = "checkpoints/qwen2.5-math-1.5b"  # converted with --max-position-embeddings 32768
    c.tokenizer = "checkpoints/qwen2.5-math-1.5b-hf"
    s = c.stages
    for name in ("sft1", "sft2"):
        s[name].model.preset = "qwen2.5-math-1.5b"  # read only for a random init (base_checkpoint empty)
        s[name].data.seq_len = CONTEXT  # not published: packed rows as long as the extended context
    s.self_distill.sft.model.preset = "qwen2.5-math-1.5b"

    s.select.pools = ("sft1", "sft2")  # both SFT stages' periodic checkpoints compete per domain
    c.probe.sampler.max_new_tokens = WINDOW_32K
    s.profile.sampler.max_new_tokens = WINDOW_32K
    s.select.sampler.max_new_tokens = WINDOW_32K

    for name in ("rl_math", "long2short", "rl_code", "rl_stem", "rl_instruct"):
        s[name].data.max_prompt_tokens = PROMPT_BUDGET
        s[name].rollout.sampler.max_new_tokens = WINDOW_32K
    s.rl_math.rollout.sampler.max_new_tokens = WINDOW_16K  # phase 1 of the progressive window
    s.long2short.train.steps = 300  # not published: math RL phase 2 (32K), Long2Short-shaped (see the docstring)
    s.rl_stem.enabled = False  # 3B additions (see the docstring)
    s.self_distill.enabled = False
    s.rl_instruct.enabled = False

    for name, bench in s.eval.benchmarks.items():
        bench.sampling.max_new_tokens = WINDOW_32K
    s.eval.benchmarks.lcb.sampling.temperature = 0.6  # RECIPE: the 1.5B work's code evals
    return c
