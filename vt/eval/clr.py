"""CLR: claim-level reliability test-time scaling (RECIPE "CLR").

For one problem with K trajectories:
  1. from each trajectory k the model extracts M decision-relevant claims (one prompt per trajectory);
  2. the model verifies or falsifies each claim on its own (one prompt per claim): verdict v_km in {0, 1};
  3. reliability r_k = ((1/M) sum_m v_km) ** M  (one failed claim out of 5 already costs ~67%);
  4. final answers are clustered by equivalence (math-verify) and the cluster G maximising
     sum_{k in G} r_k is returned (ties: more members, then earliest; vt.eval.metrics.weighted_vote).

Parsing policy, chosen so that anything the model failed to say counts against reliability, never for it:
a trajectory whose extraction yields fewer than M claims gets v = 0 for each missing claim; a verification
reply without a final ``Verdict: TRUE`` / ``Verdict: FALSE`` line (or ``\\boxed{TRUE}``) is v = 0; a
trajectory without a final answer takes no part in the vote.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np

from vt import VtError
from vt.eval.generation import Generator
from vt.eval.metrics import cluster_answers, weighted_vote
from vt.rewards.base import answer_region

CLAIMS_PROMPT = """Below are a problem and a candidate solution. List the {M} claims in the solution that its final \
answer depends on most: key intermediate results, deductions and case distinctions. Write each as a \
self-contained statement that can be checked without the solution, one per line, exactly in this form:
Claim 1: ...
...
Claim {M}: ...

Problem:
{problem}

Candidate solution:
{solution}"""

VERIFY_PROMPT = """Problem:
{problem}

Claim about this problem:
{claim}

Check the claim independently and carefully: try to prove it, and try to find a counterexample or an error. \
End your reply with exactly one line, either "Verdict: TRUE" or "Verdict: FALSE"."""

_CLAIM_RE = re.compile(r"^\s*(?:[-*]\s*)?\**\s*claim\s*(\d+)\s*\**\s*[:.)\-]\s*\**\s*(.+?)\s*$", re.I | re.M)
_VERDICT_RE = re.compile(r"verdict\s*\**\s*[:：]?\s*\**\s*(true|false|correct|incorrect)\b", re.I)
_BOXED_VERDICT_RE = re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*(true|false)\s*\}?\s*\}", re.I)


@dataclasses.dataclass(frozen=True)
class ClrChoice:
    index: int | None  # the sample leading the chosen cluster (None: no trajectory has an answer)
    answer: str | None
    reliability: list[float]  # r_k per trajectory
    cluster_scores: dict[int, float]  # cluster id -> sum of r_k


def clip_solution(text: str, max_chars: int) -> str:
    """The end of a long trajectory (where the answer and its justification are), marked as cut."""
    return text if len(text) <= max_chars else "[...]\n" + text[-max_chars:]


def claims_messages(problem: str, solution: str, M: int, max_solution_chars: int = 24000) -> list[dict]:
    text = CLAIMS_PROMPT.format(M=M, problem=problem, solution=clip_solution(solution, max_solution_chars))
    return [{"role": "user", "content": text}]


def verify_messages(problem: str, claim: str) -> list[dict]:
    return [{"role": "user", "content": VERIFY_PROMPT.format(problem=problem, claim=claim)}]


def parse_claims(reply: str, M: int) -> list[str | None]:
    """Claims 1..M from an extraction reply (text after ``</think>``); None where claim m is missing.
    The first statement of each number wins."""
    found: dict[int, str] = {}
    for num, claim in _CLAIM_RE.findall(answer_region(reply)):
        m = int(num)
        if 1 <= m <= M and m not in found and claim.strip():
            found[m] = claim.strip()
    return [found.get(m) for m in range(1, M + 1)]


def parse_verdict(reply: str) -> int:
    """1 for a final TRUE verdict, 0 for FALSE or no verdict (the last verdict in the answer region)."""
    region = answer_region(reply)
    hits = [m.group(1).lower() for m in _VERDICT_RE.finditer(region)]
    hits += [m.group(1).lower() for m in _BOXED_VERDICT_RE.finditer(region)] if not hits else []
    return int(bool(hits) and hits[-1] in ("true", "correct"))


def reliability(verdicts_KM: np.ndarray) -> np.ndarray:
    """r_k = ((1/M) sum_m v_km) ** M."""
    v = np.asarray(verdicts_KM, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] < 1:
        raise VtError(f"CLR verdicts must be K x M with M >= 1, got shape {v.shape}")
    return v.mean(axis=1) ** v.shape[1]


def clr_select(answers: Sequence[str | None], verdicts_KM: np.ndarray,
               equivalent: Callable[[str, str], bool] | None = None,
               clusters: Sequence[int | None] | None = None) -> ClrChoice:
    """The reliability-weighted vote. ``clusters`` (precomputed ids) replaces clustering ``answers``."""
    r = reliability(verdicts_KM)
    if len(answers) != len(r):
        raise VtError(f"CLR: {len(answers)} answers but {len(r)} rows of verdicts")
    cl = list(clusters) if clusters is not None else cluster_answers(answers, equivalent)
    scores: dict[int, float] = {}
    for c, rk in zip(cl, r):
        if c is not None:
            scores[c] = scores.get(c, 0.0) + float(rk)
    idx = weighted_vote(cl, r.tolist())
    return ClrChoice(idx, None if idx is None else answers[idx], r.tolist(), scores)


def collect_verdicts(generator: Generator, problems: Sequence[str], solutions: Sequence[Sequence[str]], M: int,
                     seed: int, claim_max_new_tokens: int | None = None,
                     verify_max_new_tokens: int | None = None) -> list[np.ndarray]:
    """Steps 1-2 for several problems at once (two generate calls in all): a K_i x M verdict array each."""
    jobs = [(p, k) for p, sols in enumerate(solutions) for k in range(len(sols))]
    if not jobs:
        return [np.zeros((0, M)) for _ in solutions]
    replies = generator.generate([claims_messages(problems[p], solutions[p][k], M) for p, k in jobs], 1, seed,
                                 claim_max_new_tokens)
    claims = [parse_claims(r[0].text, M) for r in replies]
    checks = [(j, m) for j, cs in enumerate(claims) for m, c in enumerate(cs) if c is not None]
    verdicts = [np.zeros((len(s), M), np.int8) for s in solutions]
    if checks:
        out = generator.generate([verify_messages(problems[jobs[j][0]], claims[j][m]) for j, m in checks], 1,
                                 seed + 1, verify_max_new_tokens)
        for (j, m), r in zip(checks, out):
            p, k = jobs[j]
            verdicts[p][k, m] = parse_verdict(r[0].text)
    return verdicts


def run_clr(generator: Generator, problem: str, solutions: Sequence[str], answers: Sequence[str | None], M: int,
            seed: int = 0, equivalent: Callable[[str, str], bool] | None = None, **caps) -> ClrChoice:
    """CLR for one problem end to end (claims, verification, vote) through ``generator``."""
    (verdicts,) = collect_verdicts(generator, [problem], [solutions], M, seed, **caps)
    return clr_select(answers, verdicts, equivalent)


def clr_for_rows(cfg, generator: Generator, problems, rows: list[dict], completions, seed: int) -> None:
    """The eval runner's hook: add ``row["clr"]`` = one pick per run (run r uses samples [rK, (r+1)K)).

    Clusters are the rows' majority-vote clusters (math-verify equivalence, every correct answer in the
    gold's cluster), so CLR and maj@k compare like with like."""
    K, M = cfg.K, cfg.M
    texts, sols, spans = [], [], []
    for p, row, comps in zip(problems, rows, completions):
        question = p.messages[-1]["content"]
        for r in range(cfg.runs):
            texts.append(question)
            sols.append([c.text for c in comps[r * K:(r + 1) * K]])
            spans.append((row, r))
    verdicts = collect_verdicts(generator, texts, sols, M, seed + 7_777_777, cfg.claim_max_new_tokens,
                                cfg.verify_max_new_tokens)
    for (row, r), v in zip(spans, verdicts):
        lo = r * K
        samples = row["samples"][lo:lo + K]
        choice = clr_select([s["answer"] for s in samples], v, clusters=row["clusters"][lo:lo + K])
        correct = choice.index is not None and bool(samples[choice.index]["correct"])
        row.setdefault("clr", []).append({"run": r, "chosen": None if choice.index is None else lo + choice.index,
                                          "answer": choice.answer, "correct": correct,
                                          "reliability": [round(x, 6) for x in choice.reliability],
                                          "verdicts": v.tolist()})
