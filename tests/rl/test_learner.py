"""The MGPO learner end to end: real sampler, real math verifier, real optimiser."""
import json

import numpy as np
import pytest

from rl_helpers import metrics, rl_config, run_rl_process, shared_task
from vt.checkpoint.params import load_model
from vt.checkpoint.params import flat_params
from vt.rl.learner import train_rl
from vt.rl.rollouts import prompts_for_step


@pytest.fixture(scope="module")
def task(shared_dir):
    return shared_task()


def test_mgpo_raises_held_out_accuracy(task, tmp_path):
    """Fixed seed; generous margin. Measured when written: 0.31 -> 0.63 held-out avg@4 in 30 steps."""
    result = train_rl(rl_config(task), tmp_path / "mgpo")
    (s0, before), (s1, after) = result.eval_history[0], result.eval_history[-1]
    assert s0 == 0 and s1 == 30
    assert 0.1 <= before <= 0.6, before  # the starting point the issue asks for
    assert after >= before + 0.15, result.eval_history
    rows = metrics(tmp_path / "mgpo")
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 30
    for key in ("reward_mean", "accuracy", "w_mean", "entropy", "clip_fraction", "is_weight_mean", "mismatch_kl",
                "response_len_mean", "truncated_fraction", "time_rollout_s", "time_train_s", "reward_mean/math"):
        assert key in steps[0], key
    # on-policy with one update per batch: the learner reproduces the sampler's log-probs
    assert all(abs(r["mismatch_kl"]) < 1e-4 for r in steps)


def test_resume_gives_the_same_rollouts_and_params(task, tmp_path):
    """Stop after 3 steps, resume to 6: the same rollouts (hashes) and bitwise-equal params as 6 straight."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    over = {"train.eval_every": 0, "checkpoint.every": 3}
    train_rl(rl_config(task, **{**over, "train.steps": 6}), straight)
    train_rl(rl_config(task, **{**over, "train.steps": 3}), resumed)
    train_rl(rl_config(task, **{**over, "train.steps": 6}), resumed)
    a = {r["step"]: r for r in metrics(straight) if "rollout_hash" in r}
    b = {r["step"]: r for r in metrics(resumed) if "rollout_hash" in r}
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert [a[s]["rollout_hash"] for s in a] == [b[s]["rollout_hash"] for s in a]
    pa = flat_params(load_model(straight / "checkpoints" / "6"))
    pb = flat_params(load_model(resumed / "checkpoints" / "6"))
    for k in pa:
        assert np.array_equal(np.asarray(pa[k]), np.asarray(pb[k])), k


def test_prompt_order_is_deterministic_and_covers_epochs():
    a = prompts_for_step(10, 0, 4, seed=1), prompts_for_step(10, 1, 4, seed=1), prompts_for_step(10, 2, 4, seed=1)
    first_epoch = np.concatenate(a)[:10]
    assert sorted(first_epoch.tolist()) == list(range(10))
    np.testing.assert_array_equal(prompts_for_step(10, 1, 4, seed=1), a[1])


def test_sharded_rl_matches_single_device(task, tmp_path):
    """Two RL steps on a (data 2, fsdp 2, tensor 2) mesh of 8 CPU devices equal one device: identical rollouts,
    losses within 1e-5, and per tensor the parameter change within 1e-3 of its own norm.

    The change is compared as a whole rather than element by element on purpose: Adam divides by sqrt(v), so
    an element whose gradient is ~0 moves by up to lr on the sign of float-reassociation noise; such elements
    differ legitimately between reduction orders (seen: one element in 49k off by 7e-5 with lr 1e-3)."""
    for name, (data, fsdp, tensor) in (("one", (1, 1, 1)), ("eight", (2, 2, 2))):
        proc = run_rl_process(task, {"train.steps": 2, "train.eval_every": 0, "mesh.data": data, "mesh.fsdp": fsdp,
                                     "mesh.tensor": tensor}, tmp_path / name,
                              env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={data * fsdp * tensor}",
                                   "JAX_PLATFORMS": "cpu"})
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = metrics(tmp_path / "one"), metrics(tmp_path / "eight")
    assert [r["rollout_hash"] for r in a if "rollout_hash" in r] == [r["rollout_hash"] for r in b if "rollout_hash" in r]
    p0 = flat_params(load_model(task["ckpt"]))
    pa = flat_params(load_model(tmp_path / "one" / "checkpoints" / "2"))
    pb = flat_params(load_model(tmp_path / "eight" / "checkpoints" / "2"))
    for k in pa:
        da, db = np.asarray(pa[k]) - np.asarray(p0[k]), np.asarray(pb[k]) - np.asarray(p0[k])
        assert np.linalg.norm(da) > 0, k
        if k.endswith("attn.k_bias"):
            # The key bias adds q.b_k to every score of a query, which softmax removes: its gradient is 0 up to
            # rounding, and Adam scales that rounding noise up to ~lr per element, so its change is noise whose
            # value depends on the reduction order (seen: 1.18e-3 of its norm). The other tensors carry the check.
            continue
        assert np.linalg.norm(da - db) <= 1e-3 * np.linalg.norm(da), (k, np.linalg.norm(da - db) / np.linalg.norm(da))
    la = [r["loss"] for r in a if "loss" in r]
    lb = [r["loss"] for r in b if "loss" in r]
    np.testing.assert_allclose(la, lb, atol=1e-5, rtol=0)


def test_profile_then_drop_trivial_prompts(task, tmp_path):
    """`vt profile` writes pass rates the RL learner and SFT stage 2 read; it resumes without re-profiling."""
    from testutil import run_vt
    from vt.data.curriculum import load_pass_rates
    from vt.data.tasks import math_record
    from vt.io import write_jsonl
    from vt.rl.rollouts import drop_trivial, load_records
    data = write_jsonl(tmp_path / "p.jsonl", [math_record(i, 0, with_answer=False, max_operand=3) for i in range(12)])
    out = tmp_path / "profile.jsonl"
    args = ["profile", "--ckpt", str(task["ckpt"]), "--tokenizer", str(task["tok"]), "--data", str(data),
            "--out", str(out), "--k", "8", "--max-new-tokens", "8", "--domain", "math"]
    run_vt(*args, check=True)
    rates = load_pass_rates(out)
    assert len(rates) == 12 and all(r.n == 8 for r in rates.values())
    before = out.read_text()
    assert "profiled 0 prompts" in run_vt(*args, check=True).stdout
    assert out.read_text() == before
    kept, dropped = drop_trivial(load_records(str(data), "data"), str(out))
    assert dropped == sum(r.pass_rate in (0.0, 1.0) for r in rates.values())
    assert all(0 < rates[r.prompt_id].pass_rate < 1 for r in kept)


def test_options_kl_long2short_minibatches_token_mean(task, tmp_path):
    """The optional parts of the objective run together: KL to the frozen start, Long2Short shaping,
    several updates per batch and token-mean aggregation."""
    cfg = rl_config(task, **{"train.steps": 2, "train.eval_every": 0, "mgpo.kl_coef": 0.1,
                             "mgpo.long2short_lambda": 0.2, "mgpo.mini_batches": 2, "mgpo.aggregation": "token_mean"})
    result = train_rl(cfg, tmp_path / "opts")
    rows = [r for r in metrics(tmp_path / "opts") if "loss" in r]
    assert len(rows) == 2 and result.step == 2
    assert all(np.isfinite(r["kl_ref"]) for r in rows)
    # Metrics come from each step's last mini-batch, taken after an update moved the policy off the reference.
    # No order between the steps: k3 is estimated on the step's own rollouts, and step 1's were sampled from the
    # reference itself (off-policy for the moved learner, which inflates k3), step 2's from the moved policy.
    # Since mini-batches keep whole groups this measured 0.277 then 0.0092 (packed and padded rows alike).
    assert all(r["kl_ref"] > 0 for r in rows)


def test_dynamic_sampling_replaces_zero_variance_groups(task, tmp_path):
    """With dynamic sampling the batch keeps its shape but carries fewer groups without a learning signal.

    Every 4th prompt's answer is made unreachable (-1000: the operands are small and non-negative), so its group is
    all wrong whatever the weights: the starting batch has zero-variance groups by construction. Left to chance it
    had none on one machine (accuracy 0.44: a group of 8 is uniform with probability ~1%), which depends on the
    CPU's float rounding through 400 SFT steps."""
    from vt.io import write_jsonl
    records = [json.loads(line) for line in (task["root"] / "rl.jsonl").read_text().splitlines()]
    data = write_jsonl(tmp_path / "rl_with_unreachable.jsonl",
                       [dict(r, ground_truth="-1000") if i % 4 == 0 else r for i, r in enumerate(records)])
    zero_var = {}
    for rounds in (0, 3):
        cfg = rl_config(task, **{"train.steps": 1, "train.eval_every": 0, "mgpo.dynamic_sampling_rounds": rounds,
                                 "data.train": str(data)})
        train_rl(cfg, tmp_path / f"ds{rounds}")
        row = [r for r in metrics(tmp_path / f"ds{rounds}") if "loss" in r][0]
        zero_var[rounds] = row["groups_all_correct"] + row["groups_all_wrong"]
        assert row["time_sample_s"] > 0 and row["time_reward_s"] > 0
    assert zero_var[0] > 0  # the unreachable prompts' groups at least
    assert zero_var[3] < zero_var[0], zero_var


def test_non_finite_rl_step_halts_before_any_bad_checkpoint(tmp_path):
    """lr 1e38: the first update (Adam: about lr per weight) leaves weights near float32's limit, so a later
    step's loss or gradient overflows; the run must stop there, before saving that state."""
    from vt import VtError
    from vt.config import load_config, to_dataclass
    from vt.rl.learner import RLConfig

    cfg = to_dataclass(RLConfig, load_config("configs/instruct_rl.py:smoke", [
        "--config.optim.lr=1e38", "--config.optim.final_lr=1e38", "--config.optim.clip_norm=0.0",
        "--config.train.steps=4", "--config.checkpoint.every=1", "--config.data.eval=",
        "--config.rollout.sampler.max_new_tokens=24"]))
    with pytest.raises(VtError, match=r"non-finite loss or gradient at step (\d+) .*: run halted") as e:
        train_rl(cfg, tmp_path)
    halted = int(e.value.args[0].split("at step ")[1].split(" ")[0])
    assert halted >= 2
    saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == list(range(1, halted))  # every finite step saved, the bad one not
    assert [m["step"] for m in metrics(tmp_path)] == list(range(1, halted))
    assert f"no checkpoint after step {halted - 1} was written" in e.value.args[0]


def test_lora_mgpo_raises_held_out_accuracy_with_the_base_frozen(task, tmp_path):
    """LoRA (rank 8) on the SFT'd model: held-out accuracy rises, only the adapters change, and the sampler
    (decoding with the adapters merged into its weights) reproduces the learner's log-probs (adapters applied).
    lr 5e-3, cosine to 5e-4: held-out avg@4 (steps 0, 10, 20, 30) 0.367 -> 0.523 -> 0.543 -> 0.520 on jax 0.10.2,
    0.367 -> 0.496 -> 0.539 -> 0.527 on jax 0.12.0.1, 0.379 -> 0.527 -> 0.563 -> 0.520 on jax 0.11.2; mismatch_kl
    below 2e-8 at every step. At lr 1e-2 the accuracy fell back by step 30 (constant 1e-2: 0.441 / 0.422 under
    other numerics) or collapsed to 0 by step 10 (cosine to 1e-3 on jax 0.11.2)."""
    from vt.model import lora
    cfg = rl_config(task, **{"model.lora_rank": 8, "model.lora_alpha": 16.0, "optim.lr": 5e-3, "optim.final_lr": 5e-4})
    result = train_rl(cfg, tmp_path / "lora")
    (s0, before), (s1, after) = result.eval_history[0], result.eval_history[-1]
    print(f"LoRA MGPO held-out accuracy: {result.eval_history}")
    assert s0 == 0 and s1 == 30
    assert after >= before + 0.1, result.eval_history
    steps = [r for r in metrics(tmp_path / "lora") if "loss" in r]
    assert all(abs(r["mismatch_kl"]) < 1e-4 for r in steps)
    start = flat_params(load_model(task["ckpt"]))
    end = flat_params(load_model(tmp_path / "lora" / "checkpoints" / "30"))
    assert set(end) - set(start) == {k for k in end if lora.is_adapter(k)}
    for k in start:
        assert np.array_equal(np.asarray(start[k]), np.asarray(end[k])), k
