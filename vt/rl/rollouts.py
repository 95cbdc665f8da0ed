"""From prompts to a scored, learner-ready RL batch: the records and each step's prompts, sample C responses
(verifying each as it finishes), build token rows.

Host-side and framework-light: the device work is the sampler's (vt.sampling) and the learner's (vt.rl.step).

RL shape letters (distinct from the model's B, T, N, G, ... of vt.model.qwen2): E prompts, C completions
(responses) per prompt, Y = E * C completions, T tokens per row, W rows of a learner batch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from vt import VtError
from vt.buckets import bucket
from vt.data.curriculum import load_pass_rates
from vt.data.packing import first_fit_rows, pack_lengths
from vt.data.sources import Malformed, Record, open_source
from vt.model.segments import BRANCH
from vt.rewards.base import RewardFunction, RewardSpecError, scores_and_mask
from vt.rewards.streaming import StreamingScorer, busy_seconds
from vt.sampling.config import Request
from vt.sampling.engine import Engine, Sample
from vt.tools.answer import final_answer


def load_records(spec: str, where: str):
    source = open_source(spec)
    records = [source[i] for i in range(len(source))]
    bad = [r for r in records if isinstance(r, Malformed)]
    if bad:
        raise VtError(f"{where}: {len(bad)} malformed record(s), first at {bad[0].where}: {bad[0].reason}")
    if not records:
        raise VtError(f"{where}={spec!r}: no records")
    return records


def drop_trivial(records, profile_path: str):
    """RECIPE: before an RL phase, drop prompts the starting checkpoint always or never solves."""
    rates = load_pass_rates(profile_path)
    kept = [r for r in records if r.prompt_id in rates and 0.0 < rates[r.prompt_id].pass_rate < 1.0]
    return kept, len(records) - len(kept)


def prompts_for_step(n_records: int, step: int, E: int, seed: int) -> np.ndarray:
    """Indices of step `step`'s prompts: consecutive slices of per-epoch permutations (deterministic)."""
    start = step * E
    out = []
    while len(out) < E:
        epoch, offset = divmod(start + len(out), n_records)
        perm = np.random.default_rng([seed, epoch]).permutation(n_records)
        out.extend(perm[offset: offset + E - len(out)].tolist())
    return np.asarray(out)


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


# The timings of a Scored, in seconds (summed when Scored.concat joins rollouts):
#   time_sample_s   decoding (Engine.generate)
#   time_reward_s   waiting for verdicts after decoding ended (with streaming, the verification not hidden)
#   time_verify_s   wall time during which at least one verification ran (the verifier pool's busy time)
#   time_overlap_s  the part of time_verify_s before decoding ended (0 when scored after decoding)
#   time_teacher_s  wall time during which an OPD teacher scored completions (vt.rl.opd; 0 without one)
#   time_teacher_overlap_s  the part of time_teacher_s before decoding ended
TIMES = ("time_sample_s", "time_reward_s", "time_verify_s", "time_overlap_s", "time_teacher_s",
         "time_teacher_overlap_s")


@dataclasses.dataclass
class Scored:
    """C samples for each of E prompts with their verdicts. Arrays are [E, C]."""
    prompts: list[list[int]]
    samples: list[list[Sample]]
    correct: np.ndarray  # bool: reward == 1 (binary correctness: what p(q) counts)
    rewards: np.ndarray  # float32 reward scores (partial credit possible; 0 at verifier errors)
    valid: np.ndarray  # bool: the verifier produced a verdict
    lengths: np.ndarray  # int: completion tokens the policy sampled (policy_tokens: a tool turn's are not counted)
    truncated: np.ndarray  # bool: finish_reason == "length"
    domains: list[str]
    time_sample_s: float = 0.0  # TIMES above
    time_reward_s: float = 0.0
    time_verify_s: float = 0.0
    time_overlap_s: float = 0.0
    time_teacher_s: float = 0.0
    time_teacher_overlap_s: float = 0.0
    # bool: the verdict is 0 because the check or the program ran out of time (failure "timeout": counted apart
    # from other wrong answers and from verifier errors); None where not recorded
    timeouts: np.ndarray | None = None
    # OPD: the teacher's log-prob of each completion token, teacher[q][g] [len(completion)]; None without one
    teacher: list[list[np.ndarray]] | None = None

    def informative(self) -> np.ndarray:
        """[E] bool: groups whose verified rewards are not all equal (the only ones with a learning signal)."""
        out = np.zeros(len(self.prompts), bool)
        for q in range(len(self.prompts)):
            r = self.rewards[q][self.valid[q]]
            out[q] = r.size > 1 and r.min() != r.max()
        return out

    def select(self, groups: Sequence[int]) -> "Scored":
        g = list(groups)
        return Scored([self.prompts[q] for q in g], [self.samples[q] for q in g], self.correct[g], self.rewards[g],
                      self.valid[g], self.lengths[g], self.truncated[g], [self.domains[q] for q in g],
                      **{t: getattr(self, t) for t in TIMES},
                      timeouts=None if self.timeouts is None else self.timeouts[g],
                      teacher=None if self.teacher is None else [self.teacher[q] for q in g])

    @staticmethod
    def concat(parts: Sequence["Scored"]) -> "Scored":
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return Scored([x for p in parts for x in p.prompts], [x for p in parts for x in p.samples], cat("correct"),
                      cat("rewards"), cat("valid"), cat("lengths"), cat("truncated"),
                      [d for p in parts for d in p.domains], **{t: sum(getattr(p, t) for p in parts) for t in TIMES},
                      timeouts=cat("timeouts") if all(p.timeouts is not None for p in parts) else None,
                      teacher=[x for p in parts for x in p.teacher] if all(p.teacher is not None for p in parts)
                      else None)


def policy_tokens(sample: Sample) -> int:
    """The sample's length as a response: the completion tokens the policy sampled (Long2Short's and the length
    metrics' count), not the tool turns' tokens in between (context the policy read)."""
    return len(sample.completion_ids) if sample.policy_mask is None else int(np.count_nonzero(sample.policy_mask))


@contextlib.contextmanager
def _naming(record: Record, domain: str):
    """A dataset error (RewardSpecError) from a domain's batch becomes a VtError naming its first record."""
    try:
        yield
    except RewardSpecError as e:
        raise VtError(f"{record.where or record.id} (batch of domain {domain}): {e}") from None


def rollout_and_score(engine: Engine, tokenizer, records: Sequence[Record], rewards: dict[str, RewardFunction],
                      *, group_size: int, seed: int, max_prompt_tokens: int, domain: str = "",
                      first_request: int = 0, stream: bool = True,
                      on_decoded: Callable[[], None] | None = None, teacher=None) -> Scored:
    """first_request: the index of records[0] among the step's prompts (a process's share samples with the seeds
    the whole batch would use; see Engine.generate).

    stream: verify each sample as soon as the engine finishes it, beside decoding (vt.rewards.streaming), for the
    domains whose reward streams; the others, and every domain with stream=False, are scored after decoding.
    Either way a domain's verdicts are those of its reward on the batch of its records' samples, in order (q, g).

    on_decoded() is called once decoding ends, before the wait for the verdicts (the engine is free again).

    teacher(count) -> a vt.rl.teachers.StreamingTeacher for `count` completions (OPD): each completion is submitted to
    it as it finishes, scored beside decoding; Scored.teacher holds the log-probs."""
    prompts = [prompt_ids(r, tokenizer, max_prompt_tokens) for r in records]
    E, C = len(records), group_size
    domains = [domain or r.domain for r in records]
    rows: dict[str, list[int]] = {}  # domain -> its prompts; sample g of rows[d][k] is item k * C + g of its batch
    for q, d in enumerate(domains):
        rows.setdefault(d, []).append(q)
    for d in sorted(rows):
        if d not in rewards:
            raise VtError(f"records of domain {d!r} but no reward configured for it (have {sorted(rewards)})")
    batch = {d: [reward_record(records[q]) for q in qs for _ in range(C)] for d, qs in rows.items()}
    item = {q: k * C for qs in rows.values() for k, q in enumerate(qs)}  # item index of the prompt's sample 0
    results: dict[str, list] = {}
    spans: list[tuple[float, float]] = []
    with contextlib.ExitStack() as stack:
        scorers: dict[str, StreamingScorer] = {}
        for d in sorted(rows):
            if stream and rewards[d].streams:
                with _naming(records[rows[d][0]], d):
                    scorers[d] = stack.enter_context(StreamingScorer(rewards[d], batch[d]))
        scoring = stack.enter_context(teacher(E * C)) if teacher is not None else None

        def on_finished(q: int, g: int, sample: Sample) -> None:
            if scoring is not None:
                scoring.submit(q * C + g, prompts[q], sample.completion_ids)
            if domains[q] in scorers:
                scorers[domains[q]].submit(item[q] + g, final_answer(sample, tokenizer))

        t0 = time.perf_counter()
        samples = engine.generate([Request(prompt_ids=p, n=group_size) for p in prompts], seed=seed,
                                  first_request=first_request,
                                  on_finished=on_finished if scorers or scoring is not None else None)
        t1 = time.perf_counter()
        if on_decoded is not None:
            on_decoded()
        for d in sorted(rows):
            with _naming(records[rows[d][0]], d):
                if d in scorers:
                    results[d] = scorers[d].results()
                    spans += scorers[d].spans
                else:
                    texts = [final_answer(s, tokenizer) for q in rows[d] for s in samples[q]]
                    start = time.perf_counter()
                    results[d] = rewards[d](batch[d], texts)
                    spans.append((start, time.perf_counter()))
        if scoring is not None:
            flat = scoring.results()
            taught = [flat[q * C:(q + 1) * C] for q in range(E)]
    t2 = time.perf_counter()
    scores = np.zeros((E, C), np.float32)
    valid = np.zeros((E, C), bool)
    timeouts = np.zeros((E, C), bool)
    for d, qs in rows.items():
        s, v = scores_and_mask(results[d])
        scores[qs] = s.reshape(len(qs), C)
        valid[qs] = v.reshape(len(qs), C)
        timeouts[qs] = np.array([r.failure == "timeout" for r in results[d]], bool).reshape(len(qs), C)
    lengths = np.array([[policy_tokens(s) for s in group] for group in samples])
    truncated = np.array([[s.finish_reason == "length" for s in group] for group in samples])
    return Scored(prompts, samples, correct=(scores == 1.0) & valid, rewards=scores, valid=valid,
                  lengths=lengths, truncated=truncated, domains=domains, time_sample_s=t1 - t0,
                  time_reward_s=t2 - t1, time_verify_s=busy_seconds(spans), time_overlap_s=busy_seconds(spans, t1),
                  timeouts=timeouts, teacher=taught if scoring is not None else None,
                  time_teacher_s=busy_seconds(scoring.spans) if scoring is not None else 0.0,
                  time_teacher_overlap_s=busy_seconds(scoring.spans, t1) if scoring is not None else 0.0)


ROW_BUCKET = 16  # the shortest row length (vt.buckets' series from there)


def sample_lengths(scored: Scored, max_len: int) -> np.ndarray:
    """[Y = E*C] slots each sample takes in a row: prompt + completion less one (the last token is only a
    target), cut at max_len. Samples in order q*C + g."""
    return np.array([min(len(p) + len(s.completion_ids) - 1, max_len)
                     for p, group in zip(scored.prompts, scored.samples) for s in group], np.int64)


def batch_length(scored: Scored, max_len: int) -> int:
    """The row length: the longest sample (prompt + completion less one), bucketed (16, 24, 32, 48, ...: a handful
    of compiled shapes, not one per step, at most a third of a row padding), cut at max_len."""
    return min(bucket(int(sample_lengths(scored, max_len).max()), ROW_BUCKET, half_octaves=True), max_len)


ROW_FIELDS = ("input_ids", "targets", "positions", "segment_ids", "loss_mask", "sampler_logp", "sample")


def row_units(scored: Scored, length: int, share: bool) -> list[list[int]]:
    """The samples (indices q*C + g) of each unit a row holds in one piece, in group order: one sample a unit, or
    with `share` a group's samples in as few units as fit `length` slots with the group's prompt once (first fit
    decreasing of their completions into length - (prompt - 1) slots). Samples with no completion slot stay
    units of their own (they have no loss: nothing to share)."""
    lengths = sample_lengths(scored, length)
    units, first = [], 0
    for p, group in zip(scored.prompts, scored.samples):
        idx = [first + g for g in range(len(group)) if lengths[first + g] > 0]
        first += len(group)
        prompt = len(p) - 1  # slots of the prompt before its last token: what a unit holds once
        shared = [i for i in idx if lengths[i] > prompt] if share and prompt > 0 else []
        if len(shared) < 2:
            units += [[i] for i in idx]
            continue
        units += [[i] for i in idx if lengths[i] <= prompt]
        completions = lengths[shared] - prompt
        if completions.sum() <= length - prompt:  # the whole group in one unit: nothing to search
            units.append(shared)
            continue
        units += [sorted(shared[j] for j in row) for row in first_fit_rows(completions, length - prompt)]
    return units


def unit_lengths(scored: Scored, units: list[list[int]], length: int) -> np.ndarray:
    """Slots each unit takes: its sample's, or a shared unit's prompt less its last token plus its completions."""
    lengths = sample_lengths(scored, length)
    prompt = [len(p) - 1 for p, group in zip(scored.prompts, scored.samples) for _ in group]
    return np.array([lengths[u[0]] if len(u) == 1 else prompt[u[0]] + sum(lengths[i] - prompt[i] for i in u)
                     for u in units], np.int64)


def build_rows(scored: Scored, length: int, *, pack: bool = True, share: bool = False) -> dict[str, np.ndarray]:
    """Token rows [W, T = length] holding every sample (prompt + completion) of `scored`:

    pack=True   first-fit packed (vt.data.packing.pack_lengths): several samples per row, told apart by
                segment ids 1..k, positions restarting at 0 for each; W is about the real tokens / T.
      share=True  a group's samples packed as units (row_units) that hold the prompt once: its slots (less the
                last prompt token) are document s, each sample's completion (after the last prompt token) a
                branch s + j * BRANCH of it (vt.model.segments) at the positions it would have alone. Each
                completion slot sees what it sees in a row of its own, so log-probs and gradients are the
                unshared rows' (tests/rl/test_packed_rl.py); prompt slots are computed once a unit, not once a
                sample (the toy RL step's 11-token prompts x 8 samples: 800 slots instead of 1,920).
    pack=False  padded: sample i alone in row i, right-padded (W = Y).

    Slot t predicts targets[t]; `loss_mask` is 1 where that target is a completion token the policy sampled (not
    a tool turn's: Sample.policy_mask; so no loss, KL, entropy or IS ratio there, and objective weights count
    policy tokens), `sampler_logp` holds the sampler's log-prob of it, and `sample` the index (q*C + g) of the
    sample in the slot (-1 on padding and on a shared prompt), by which per-sample values become per-token ones
    (`per_token`). Samples longer than T are cut (T >= the batch_length of every process's samples, so none is)."""
    pairs = [(p, s) for p, group in zip(scored.prompts, scored.samples) for s in group]
    T = length
    units = row_units(scored, T, share and pack) if pack else [[i] for i in range(len(pairs))]
    lengths = unit_lengths(scored, units, T)
    # Every unit's slots, concatenated: unit u's are flat[offsets[u]: offsets[u] + lengths[u]], with the rotary
    # position, branch number and sample of each slot.
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    flat = {"input_ids": np.zeros(total, np.int32), "targets": np.zeros(total, np.int32),
            "loss_mask": np.zeros(total, np.float32), "sampler_logp": np.zeros(total, np.float32),
            "positions": np.zeros(total, np.int32), "branch": np.zeros(total, np.int32),
            "sample": np.full(total, -1, np.int32)}

    def put(o, ids, first, logprobs, position, branch, sample, policy=None):
        """Slots o.. for ids[:-1] predicting ids[1:]; targets from `first` on are completion tokens, trained on
        where `policy` (Sample.policy_mask) says the policy sampled them (a tool's tokens are context only)."""
        n = len(ids) - 1
        flat["input_ids"][o:o + n], flat["targets"][o:o + n] = ids[:-1], ids[1:]
        k = max(0, n - first)
        flat["loss_mask"][o + first:o + first + k] = 1.0 if policy is None else np.asarray(policy[:k], np.float32)
        flat["sampler_logp"][o + first:o + first + k] = np.asarray(logprobs[:k], np.float32)
        flat["positions"][o:o + n] = position + np.arange(n)
        flat["branch"][o:o + n], flat["sample"][o:o + n] = branch, sample
        return o + n

    for u, members in enumerate(units):
        p = list(pairs[members[0]][0])
        if len(members) == 1:
            i = members[0]
            put(offsets[u], np.asarray(p + list(pairs[i][1].completion_ids), np.int32)[: T + 1], len(p) - 1,
                pairs[i][1].logprobs, 0, 0, i, pairs[i][1].policy_mask)
            continue
        o = put(offsets[u], np.asarray(p, np.int32), len(p), (), 0, 0, -1)  # the prompt: no completion target
        for j, i in enumerate(members, start=1):
            ids = np.asarray(p[-1:] + list(pairs[i][1].completion_ids), np.int32)[: T - len(p) + 2]
            o = put(o, ids, 0, pairs[i][1].logprobs, len(p) - 1, j, i, pairs[i][1].policy_mask)
    if pack:
        layout = pack_lengths(lengths, T)
    else:
        slot = np.arange(T)[None]
        inside = slot < lengths[:, None]
        layout = {"sample": np.where(inside, np.arange(len(units))[:, None], -1),
                  "segment_ids": inside.astype(np.int32), "positions": np.where(inside, slot, 0)}
    used = layout["sample"] >= 0  # layout["sample"] is the unit in each slot, "positions" the slot within it
    at = np.where(used, offsets[np.maximum(layout["sample"], 0)] + layout["positions"], 0)
    out = {k: np.where(used, v[at] if total else 0, 0 if k != "sample" else -1).astype(v.dtype)
           for k, v in flat.items()}
    out["segment_ids"] = np.where(used, layout["segment_ids"] + out.pop("branch") * BRANCH, 0).astype(np.int32)
    return {k: out[k] for k in ROW_FIELDS}


def per_token(values_Y: np.ndarray, sample: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Per-sample values [Y] spread over each sample's slots of `sample` (build_rows' field); 0 on padding."""
    values = np.asarray(values_Y)
    return np.where(sample >= 0, values[np.maximum(sample, 0)] if values.size else 0, 0).astype(dtype)
