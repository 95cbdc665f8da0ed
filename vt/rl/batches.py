"""The learner's side of an RL batch, on the host: advantages, the step's row length, the rows and micro-batches
of each optimiser update, and the step's rollout statistics.

The learner computes on the samples' real lengths: prompt + completion first-fit packed into rows of a length
chosen per step (`row_length`: the bucketed longest sample or a few buckets more, by the slots its micro-batches
compute; segment ids, positions restarting per sample; vt.rl.rollouts.build_rows), a group's prompt held once per
row with its completions as branches of it (`train.share_prompts`, vt.model.segments), and every pass (pi_old,
the KL reference, each update: vt.rl.step) runs over micro-batches of about `train.tokens_per_micro_batch` slots
with the gradients summed, so one long sample among hundreds of short ones neither pads them all nor grows the
memory a pass needs. Per-token objective weights make the sums the same per-sequence (or per-token) mean as one
padded row per sample; metrics tokens_real / tokens_computed / padding_fraction count the waste.
"""
from __future__ import annotations

import functools
import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np

from vt import VtError
from vt.buckets import bucket
from vt.data.packing import packed_rows
from vt.distributed import allgather, global_batch
from vt.model.attention import resolve, supports_branches
from vt.rewards.shaping import long2short
from vt.rl import objectives as obj
from vt.rl import opd
from vt.rl.rollouts import ROW_BUCKET, Scored, batch_length, build_rows, per_token, row_units, unit_lengths
from vt.rl.step import ROW_KEYS, row_sharding


def step_advantages(s: Scored, m) -> tuple[np.ndarray, np.ndarray]:
    """(w(q) * A_i [E, C], w(q) [E]) of a step's groups, from the rewards (Long2Short-shaped when enabled)."""
    rewards = s.rewards
    if m.tool_call_reward:  # a bonus (> 0) or penalty (< 0) per tool call, beside the verdict (which stays binary)
        rewards = rewards + m.tool_call_reward * np.array([[x.tool_calls for x in g] for g in s.samples], np.float32)
    adv, w = _advantages(rewards, s.correct, s.lengths, s.valid, m.long2short_lambda, m.gamma, m.adv_eps,
                         m.std_ddof)
    return np.asarray(adv), np.asarray(w)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _advantages(rewards, correct, lengths, valid, long2short_lambda, gamma, eps, ddof):
    # One compiled program per run (its [E, C] shapes are fixed): dispatched op by op, these ~40 tiny jnp ops
    # cost ~7 ms of host time per RL step (cProfile of the toy bench), as much as the update's own dispatch.
    if long2short_lambda > 0:
        rewards = long2short(jnp.where(correct, 1.0, rewards), lengths, long2short_lambda)
    return obj.mgpo_advantages(rewards, correct, gamma, eps, ddof, valid)


def shares_prompts(train, model_cfg) -> bool:
    """Do the learner's rows hold a group's prompt once (train.share_prompts, packed rows, an attention
    implementation that masks branches: vt.model.attention.supports_branches)?"""
    impl = resolve(model_cfg.attention_impl, model_cfg.dtype)
    return train.share_prompts and train.pack_rows and supports_branches(impl)


def row_length(s: Scored, model_cfg, pack: bool, tokens_per_micro_batch: int, mesh, share: bool = False,
               candidates: int = 3) -> int:
    """The step's row length T, the same on every process: at least every process's longest sample, bucketed
    (batch_length). Packed, the cheapest of the next `candidates` buckets (cut at the context length; with
    `share`, three more: rows long enough to hold a group's prompt once with several of its completions) by the
    FLOPs of the rows its micro-batches compute (micro_batch_sizes: first-fit's rows of build_rows' units, the
    last micro-batch's rounded up to a compiled shape) x T x FLOPs per token at T, the shortest on a tie; the
    step's rows are costed as one mini-batch. bench/rl_step.py's toy step unshared: 125 samples of 15 slots and
    three of 16-18 fill 65 rows of 32 (two a row, the 18 alone), which run as 96 (3,072 slots), or 43 rows of
    48 (three a row), which run as 48 (2,304 slots); one sample a row of 24 takes 3,072. Shared, a group of 8
    samples of an 11-token prompt takes 10 + 8 x 5 slots: 1,024 slots in all (half a group a row of 32, or a
    whole group a row of 64)."""
    max_len = model_cfg.max_position_embeddings
    T = int(allgather(batch_length(s, max_len)).max())
    if not pack:
        return T
    options = [T]
    while len(options) < candidates + 3 * share and options[-1] < max_len:
        options.append(min(bucket(options[-1] + 1, ROW_BUCKET, half_octaves=True), max_len))
    if len(options) == 1:
        return T
    rows = allgather(np.array([packed_rows(unit_lengths(s, row_units(s, t, share), t), t) for t in options],
                              np.int64)).max(0)
    computed = [sum(micro_batch_sizes(t, int(r), tokens_per_micro_batch, mesh)) * t for r, t in zip(rows, options)]
    cost = [c * model_cfg.flops_per_token(t) for c, t in zip(computed, options)]
    return options[int(np.argmin(cost))]


def micro_batch_sizes(T: int, rows: int, tokens_per_micro_batch: int, mesh) -> list[int]:
    """Rows each micro-batch of a mini-batch takes from this process, for `rows` rows (the most any process
    has): full micro-batches of tokens_per_micro_batch / T rows over all processes (one shape per row length
    T), and a last one cut to the rows left, rounded up to 1, 2, 3, 4, 6, 8, 12, ... (at most a third of it
    padding, a few more shapes, each compiled once; none where a full micro-batch is one row per shard, as at
    long row lengths). Multiples of `unit`, so that a global micro-batch splits evenly over the batch shards
    (data x fsdp) and the processes."""
    count = jax.process_count()
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    unit = math.lcm(shards, count) // count
    full = max(1, tokens_per_micro_batch // T // count // unit) * unit
    n = max(1, -(-rows // full))
    units = -(-max(rows - (n - 1) * full, 1) // unit)
    return [full] * (n - 1) + [min(full, unit * (1 if units <= 1 else bucket(units, 2, half_octaves=True)))]


def learner_batches(s: Scored, adv: np.ndarray, T: int, step: int, cfg, mesh, share: bool = False
                    ) -> tuple[list[list[dict]], list[np.ndarray], dict[str, float]]:
    """This process's groups as `mgpo.mini_batches` mini-batches (whole groups each; with several, a
    permutation of the groups keyed by (rollout.sampler.seed, `step`: the optimiser updates before this RL
    step, state.step)), each a list of micro-batches: global arrays of
    rows [b, T] (vt.rl.rollouts.build_rows, packed or padded as train.pack_rows says, prompts shared as `share`
    says; b: micro_batch_sizes)
    with per-token advantages and objective weights (objectives.objective_weights over the whole mini-batch,
    all processes). Every process makes the same micro-batches of the same shapes (empty rows fill them up).
    Returns them, each mini-batch's group indices, and the step's token counts: real (slots holding a token) and
    computed (row slots), all processes, one pass."""
    m, t = cfg.mgpo, cfg.train
    E, C = adv.shape
    if E % m.mini_batches:
        raise VtError(f"config mgpo.mini_batches={m.mini_batches} must divide the prompt groups of a process "
                      f"(rollout.prompts_per_step / processes = {E}): a mini-batch keeps whole groups")
    k = E // m.mini_batches
    order = np.random.default_rng([cfg.rollout.sampler.seed, step]).permutation(E) if m.mini_batches > 1 else np.arange(E)
    groups = [order[i * k:(i + 1) * k] for i in range(m.mini_batches)]
    minis, taught = [], {}
    for g in groups:
        sel = s.select(g)
        rows = build_rows(sel, T, pack=t.pack_rows, share=share)
        rows["adv"] = per_token(adv[g].reshape(-1), rows["sample"])
        if cfg.opd.enabled:  # per-token advantages from the teacher's log-probs (vt.rl.opd)
            prompt_lengths = np.array([len(p) for p, group in zip(sel.prompts, sel.samples) for _ in group])
            rows["adv"], sums = opd.row_advantages(rows, prompt_lengths, [x for q in sel.teacher for x in q], cfg.opd)
            taught = {k: taught.get(k, 0.0) + v for k, v in sums.items()}
        used = rows["sample"] >= 0
        completion = np.bincount(rows["sample"][used], weights=rows["loss_mask"][used], minlength=k * C)
        minis.append((rows, completion))
    # One collective for the whole step: each mini-batch's completion tokens, rows and real slots, per process.
    counts = allgather(np.array([[c.sum(), len(r["input_ids"]), np.count_nonzero(r["segment_ids"])]
                                 for r, c in minis], np.int64))
    completion_tokens, real = counts[..., 0].sum(0), counts[..., 2].sum()
    sh = row_sharding(mesh)
    out, computed = [], 0
    for i, (rows, completion) in enumerate(minis):
        weights = obj.objective_weights(completion, m.aggregation, k * C * jax.process_count(),
                                        int(completion_tokens[i]))
        rows["weight"] = per_token(weights, rows["sample"]) * rows["loss_mask"]
        micro, start = [], 0
        for b in micro_batch_sizes(T, int(counts[:, i, 1].max()), t.tokens_per_micro_batch, mesh):
            part = {key: rows[key][start:start + b] for key in ROW_KEYS}
            part = {key: np.concatenate([v, np.zeros((b - len(v), T), v.dtype)]) if len(v) < b else v
                    for key, v in part.items()}
            micro.append(global_batch(part, sh))
            start += b
            computed += b * jax.process_count() * T
        out.append(micro)
    host = {"tokens_real": float(real), "tokens_computed": float(computed),
            "padding_fraction": 1.0 - float(real) / max(computed, 1)}
    if taught:  # every process's sums: per-token means over the step's completion tokens
        total = dict(zip(taught, allgather(np.array(list(taught.values()), np.float64)).sum(0)))
        n = max(total.pop("tokens"), 1.0)
        host |= {f"opd/{k}": float(v / n) for k, v in total.items()}
    return out, groups, host


def rollout_metrics(s: Scored, domains: list[str]) -> dict[str, float]:
    """Step statistics over every process's groups (gathered; process order is prompt order)."""
    def digest(group) -> np.ndarray:
        h = hashlib.sha256()
        for smp in group:
            h.update(np.asarray(smp.completion_ids, np.int32).tobytes() + b"|")
        return np.frombuffer(h.digest(), np.uint8)

    local = {"correct": s.correct, "rewards": s.rewards, "valid": s.valid, "lengths": s.lengths,
             "truncated": s.truncated, "domain": np.array([domains.index(d) for d in s.domains], np.int32),
             "timeouts": s.timeouts if s.timeouts is not None else np.zeros_like(s.valid),
             "tool_calls": np.array([[x.tool_calls for x in g] for g in s.samples], np.int32),
             "tool_errors": np.array([[x.tool_errors for x in g] for g in s.samples], np.int32),
             "completion_tokens": np.array([[len(x.completion_ids) for x in g] for g in s.samples], np.int32),
             "digest": np.stack([digest(g) for g in s.samples])}
    g = {k: (lambda a: a.reshape(-1, *a.shape[2:]))(allgather(v)) for k, v in local.items()}
    p = np.asarray(obj.group_accuracy(g["correct"], g["valid"]))
    valid, rewards = g["valid"], g["rewards"]
    hist = np.histogram(p, bins=5, range=(0.0, 1.0))[0] / max(len(p), 1)
    out = {f"pass_rate_hist/{i / 5:.1f}-{(i + 1) / 5:.1f}": float(v) for i, v in enumerate(hist)}
    out |= {"rollout_hash": hashlib.sha256(g["digest"].tobytes()).hexdigest()[:16],
            "reward_mean": float(rewards[valid].mean()) if valid.any() else float("nan"),
            "accuracy": float(p.mean()), "groups_all_correct": float((p == 1).mean()),
            "groups_all_wrong": float((p == 0).mean()), "verifier_errors": float((~valid).mean()),
            # wrong answers whose check or program ran out of time (a verdict of 0, not a verifier error)
            "wrong_timeouts": float(g["timeouts"].mean()),
            # the policy's tokens (with tools: not the tool turns' tokens, counted in completion_len_mean)
            "response_len_mean": float(g["lengths"].mean()), "response_len_max": float(g["lengths"].max()),
            "truncated_fraction": float(g["truncated"].mean())}
    if g["tool_calls"].any():  # multi-turn samples: tool calls per sample, the share that called without error
        calls, errors = g["tool_calls"], g["tool_errors"]
        out |= {"tool_calls_mean": float(calls.mean()), "tool_calls_ok": float(((calls > 0) & (errors == 0)).mean()),
                "tool_errors_mean": float(errors.mean()), "completion_len_mean": float(g["completion_tokens"].mean())}
    for i in sorted(set(g["domain"].tolist())):
        v = valid[g["domain"] == i]
        out[f"reward_mean/{domains[i]}"] = float(rewards[g["domain"] == i][v].mean()) if v.any() else float("nan")
    return out
