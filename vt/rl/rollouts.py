"""From prompts to a scored, learner-ready RL batch: sample G responses, verify, shape, build token rows.

Host-side and framework-light: the device work is the sampler's (vt.sampling) and the learner's (vt.rl.step).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from vt import VtError
from vt.data.sources import Record
from vt.rewards.base import RewardFunction, RewardSpecError, scores_and_mask
from vt.sampling.engine import Engine, Request, Sample


def reward_record(record: Record) -> dict[str, Any]:
    """What the verifiers read: the reference fields (ground_truth, tests, constraints, rubric) and the prompt."""
    prompt = "\n".join(m["content"] for m in record.prompt if m["role"] == "user")
    return {**record.metadata, "ground_truth": record.ground_truth, "prompt": prompt, "id": record.id}


def prompt_ids(record: Record, tokenizer, max_prompt_tokens: int) -> list[int]:
    ids = tokenizer.encode_chat(list(record.prompt), add_generation_prompt=True)
    if len(ids) > max_prompt_tokens:
        raise VtError(f"{record.where or record.id}: prompt has {len(ids)} tokens, more than "
                      f"data.max_prompt_tokens={max_prompt_tokens}")
    return ids


@dataclasses.dataclass
class Scored:
    """G samples for each of Q prompts with their verdicts. Arrays are [Q, G]."""
    prompts: list[list[int]]
    samples: list[list[Sample]]
    correct: np.ndarray  # bool: reward == 1 (binary correctness: what p(q) counts)
    rewards: np.ndarray  # float32 reward scores (partial credit possible; 0 at verifier errors)
    valid: np.ndarray  # bool: the verifier produced a verdict
    lengths: np.ndarray  # int: completion tokens
    truncated: np.ndarray  # bool: finish_reason == "length"
    domains: list[str]
    time_sample_s: float = 0.0
    time_reward_s: float = 0.0

    def informative(self) -> np.ndarray:
        """[Q] bool: groups whose verified rewards are not all equal (the only ones with a learning signal)."""
        out = np.zeros(len(self.prompts), bool)
        for q in range(len(self.prompts)):
            r = self.rewards[q][self.valid[q]]
            out[q] = r.size > 1 and r.min() != r.max()
        return out

    def select(self, groups: Sequence[int]) -> "Scored":
        g = list(groups)
        return Scored([self.prompts[q] for q in g], [self.samples[q] for q in g], self.correct[g], self.rewards[g],
                      self.valid[g], self.lengths[g], self.truncated[g], [self.domains[q] for q in g],
                      self.time_sample_s, self.time_reward_s)

    @staticmethod
    def concat(parts: Sequence["Scored"]) -> "Scored":
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return Scored([x for p in parts for x in p.prompts], [x for p in parts for x in p.samples], cat("correct"),
                      cat("rewards"), cat("valid"), cat("lengths"), cat("truncated"),
                      [d for p in parts for d in p.domains], sum(p.time_sample_s for p in parts),
                      sum(p.time_reward_s for p in parts))


def rollout_and_score(engine: Engine, tokenizer, records: Sequence[Record], rewards: dict[str, RewardFunction],
                      *, group_size: int, seed: int, max_prompt_tokens: int, domain: str = "",
                      first_request: int = 0) -> Scored:
    """first_request: the index of records[0] among the step's prompts (a process's share samples with the seeds
    the whole batch would use; see Engine.generate)."""
    prompts = [prompt_ids(r, tokenizer, max_prompt_tokens) for r in records]
    t0 = time.perf_counter()
    samples = engine.generate([Request(prompt_ids=p, n=group_size) for p in prompts], seed=seed,
                              first_request=first_request)
    t1 = time.perf_counter()
    Q, G = len(records), group_size
    scores = np.zeros((Q, G), np.float32)
    valid = np.zeros((Q, G), bool)
    domains = [domain or r.domain for r in records]
    for d in sorted(set(domains)):
        if d not in rewards:
            raise VtError(f"records of domain {d!r} but no reward configured for it (have {sorted(rewards)})")
        rows = [q for q in range(Q) if domains[q] == d]
        recs = [reward_record(records[q]) for q in rows for _ in range(G)]
        texts = [s.text if s.text is not None else tokenizer.decode(s.completion_ids, skip_special_tokens=True)
                 for q in rows for s in samples[q]]
        try:
            results = rewards[d](recs, texts)
        except RewardSpecError as e:  # a data bug: name the record that carries it
            raise VtError(f"{records[rows[0]].where or records[rows[0]].id} (batch of domain {d}): {e}") from None
        s, v = scores_and_mask(results)
        scores[rows] = s.reshape(len(rows), G)
        valid[rows] = v.reshape(len(rows), G)
    lengths = np.array([[len(s.completion_ids) for s in group] for group in samples])
    truncated = np.array([[s.finish_reason == "length" for s in group] for group in samples])
    return Scored(prompts, samples, correct=(scores == 1.0) & valid, rewards=scores, valid=valid,
                  lengths=lengths, truncated=truncated, domains=domains, time_sample_s=t1 - t0,
                  time_reward_s=time.perf_counter() - t1)


def bucket_length(n: int, lo: int = 16) -> int:
    """Row lengths are padded to a power of two or 1.5x one (16, 24, 32, 48, 64, ...): a handful of compiled
    shapes, not one per step, and at most a third of a row wasted on padding."""
    b = lo
    while b < n:
        b = b * 3 // 2 if b & (b - 1) == 0 else b // 3 * 4  # 2^k -> 1.5 * 2^k -> 2^(k+1)
    return b


def batch_length(scored: Scored, max_len: int) -> int:
    """The row length build_batch pads to: the longest prompt + completion (less one), bucketed, cut at max_len."""
    longest = max(len(p) + len(s.completion_ids) - 1 for p, group in zip(scored.prompts, scored.samples) for s in group)
    return min(bucket_length(longest), max_len)


def build_batch(scored: Scored, advantages_QG: np.ndarray, max_len: int, length: int | None = None
                ) -> dict[str, np.ndarray]:
    """Token rows [N = Q*G, T]: prompt + completion, right-padded. Position t predicts targets[t]; `mask` is 1
    where that target is a completion token, and `sampler_logp` holds the sampler's log-prob of it.
    T = `length` when given (several processes agree on one: the largest batch_length), else batch_length."""
    rows = [(p, s) for p, group in zip(scored.prompts, scored.samples) for s in group]
    T = batch_length(scored, max_len) if length is None else length
    N = len(rows)
    out = {k: np.zeros((N, T), np.int32) for k in ("tokens", "targets", "positions", "segment_ids")}
    out["mask"] = np.zeros((N, T), np.float32)
    out["sampler_logp"] = np.zeros((N, T), np.float32)
    for i, (p, s) in enumerate(rows):
        ids = np.asarray(list(p) + list(s.completion_ids), np.int32)[: T + 1]
        n = len(ids) - 1
        out["tokens"][i, :n] = ids[:-1]
        out["targets"][i, :n] = ids[1:]
        out["positions"][i, :n] = np.arange(n)
        out["segment_ids"][i, :n] = 1
        first = len(p) - 1  # position whose target is the first completion token
        k = max(0, n - first)
        out["mask"][i, first:first + k] = 1.0
        out["sampler_logp"][i, first:first + k] = np.asarray(s.logprobs[:k], np.float32)
    out["adv"] = np.asarray(advantages_QG, np.float32).reshape(N)
    return out
