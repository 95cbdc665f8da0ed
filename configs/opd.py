"""On-policy distillation (vt.rl.opd): the student samples, a teacher scores every sampled token, and the
per-token reverse KL log p_teacher - log p_student is each token's advantage in the RL learner's clipped,
importance-corrected loss (the MGPO learner's rows, packing, micro-batches, staleness and LoRA).

    vt train --config configs/opd.py --workdir runs/opd --config.opd.teacher=runs/teacher/final
    vt train --config configs/opd.py --workdir runs/opd --config.opd.teacher=http://127.0.0.1:8000/v1

The teacher: a vt checkpoint (scored in bf16 on the job's mesh, parameters only) or an OpenAI-compatible server
serving prompt log-probs (vLLM `vllm serve MODEL`, SGLang); either must share the student's tokenizer (refused
at start otherwise). Everything else is configs/mgpo_math.py's; only the fields below differ. In `vt pipeline`,
the `opd` stage takes the same section (vt.recipe.stages; its teacher may also name an earlier stage).

Smoke test on CPU (tiny random student, a few steps through the real sampler, verifier and teacher; the teacher
any tiny checkpoint, e.g. one `vt demo` wrote, or tests/rl/test_opd_smoke.py's):

    vt train --config configs/opd.py:smoke --workdir /tmp/opd_smoke --config.opd.teacher=TEACHER_CKPT
"""
from configs import mgpo_math
from configs.common import parse_arg


def get_config(arg=None):
    variant = parse_arg(arg, "smoke")
    c = mgpo_math.get_config(variant)
    c.opd.teacher = "runs/teacher/final" if variant != "smoke" else ""  # a checkpoint or http://host:port/v1
    c.opd.kl_coef = 1.0  # A_t = kl_coef * (log p_teacher - log p_student) + reward_coef * w(q) A_i (discount 0)
    c.opd.reward_coef = 0.0  # > 0 mixes in the verifiable reward's MGPO advantage
    c.data.profile = ""  # every prompt teaches: the teacher's signal does not need a mixed pass rate
    c.mgpo.gamma = 0.0  # w(q) = 1: only the reward part (reward_coef) would use it
    if variant != "smoke":
        c.model.init_checkpoint = "runs/student"  # e.g. an SFT checkpoint
        c.rollout.group_size = 4  # the teacher grades each token: fewer samples per prompt than MGPO needs
        c.rollout.prompts_per_step = 64
        c.optim.lr = 1e-6
        c.optim.final_lr = 1e-6
        c.train.steps = 200
    return c
