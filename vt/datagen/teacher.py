"""Teacher-driven data construction: query expansion, LLM query-quality judging, multi-path distillation.

The teacher and the judge are ``Callable[[list[messages]], list[str | BaseException]]`` (one reply per
conversation; vt.eval.generation.teacher_from_spec builds one over vt's sampler or an OpenAI-compatible
endpoint). A reply that is an exception counts as no reply.

Expansion rewrites each seed query along one of four axes (RECIPE): concept composition, solution
skeleton, constraints, objective. Each rewrite becomes a new prompt-only row (no reference answer: its
label comes from the vote below).

Multi-path distillation samples k traces per query and keeps only verified ones:
  - with a reference (``ground_truth``, or ``tests`` for code): the domain's reward must pass it;
  - without one (math / stem): pseudo-label by majority vote over the extracted final answers, clustered
    by math-verify equivalence. The label is accepted only when the top cluster holds at least
    ``min_agreement`` of the k samples *and* strictly more votes than the runner-up (a tie is no label:
    reason ``vote_tie``); traces in the winning cluster are kept. Traces without an answer never vote.
Each kept trace records ``prompt_id``, ``pass_rate`` (verified / k) and ``rollouts`` (k) for stratification.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Annotated

from vt import VtError
from vt.data.sources import Malformed
from vt.datagen.quality import row_record
from vt.datagen.stages import RETRY
from vt.eval.answers import VOTABLE_DOMAINS, extract_answer, math_equivalence
from vt.eval.metrics import cluster_answers
from vt.rewards.base import answer_region
from vt.rewards.rubric import JudgeUnreachable
from vt.validation import AT_LEAST_1, FRACTION, check_fields

STRATEGIES = {
    "concept": "Compose it with a second, related concept so that solving it requires combining both ideas.",
    "skeleton": "Keep its solution skeleton (the same key steps and technique) but change the setting, "
                "objects and numbers.",
    "constraints": "Add, remove or tighten a constraint so that the answer changes and the problem stays "
                   "well posed.",
    "objective": "Change what is asked (a different quantity, an extremum, a count, or a proof-free "
                 "closed form) while keeping the setting.",
}

EXPAND_PROMPT = """Rewrite the following problem into a new, self-contained problem. {instruction}
The new problem must have a single, verifiable final answer. Reply with the new problem only, after the line "Problem:".

Original problem:
{problem}"""

JUDGE_PROMPT = """Judge the quality of this problem as training data: it must be self-contained, unambiguous, \
solvable, and have one verifiable final answer. End your reply with exactly one line: "Verdict: GOOD" or \
"Verdict: BAD".

Problem:
{problem}"""

_JUDGE_RE = re.compile(r"verdict\s*\**\s*[:：]?\s*\**\s*(good|bad)\b", re.I)


def _unreachable(replies) -> JudgeUnreachable | None:
    """The first transport failure among `replies`: such a row is retried on a re-run, never rejected."""
    return next((r for r in replies if isinstance(r, JudgeUnreachable)), None)


def _retry(failure: JudgeUnreachable):
    return [], RETRY, f"teacher endpoint {failure}"


def prompt_text(rec) -> str:
    return "\n".join(m["content"] for m in rec.prompt if m["role"] == "user")


def parse_rewrite(reply: str) -> str:
    text = answer_region(reply).strip()
    if "Problem:" in text:
        text = text.split("Problem:", 1)[1]
    return text.strip()


def parse_judgement(reply) -> bool | None | JudgeUnreachable:
    """True (GOOD), False (BAD), None (no verdict: rejected as ``judge_unparseable``), or the endpoint's
    transport failure (the row is retried on a re-run)."""
    if isinstance(reply, JudgeUnreachable):
        return reply
    if isinstance(reply, BaseException):
        return None
    hits = _JUDGE_RE.findall(answer_region(reply))
    return None if not hits else hits[-1].lower() == "good"


def judge_queries(judge, texts: Sequence[str]) -> list[bool | None]:
    replies = judge([[{"role": "user", "content": JUDGE_PROMPT.format(problem=t)}] for t in texts])
    return [parse_judgement(r) for r in replies]


def expand_batch(teacher, strategies: Sequence[str], judge=None):
    """batch_step for `vt data expand`: one rewrite per (seed, strategy), optionally judged."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise VtError(f"expand strategies {list(unknown)}: choose from {sorted(STRATEGIES)}")

    def step(items):
        recs = [row_record(row, where, i) for i, where, row in items]
        jobs = [(k, s) for k, r in enumerate(recs) if not isinstance(r, Malformed) for s in strategies]
        replies = teacher([[{"role": "user", "content": EXPAND_PROMPT.format(
            instruction=STRATEGIES[s], problem=prompt_text(recs[k]))}] for k, s in jobs]) if jobs else []
        rewrites = [None if isinstance(r, BaseException) else parse_rewrite(r) or None for r in replies]
        verdicts = judge_queries(judge, [r for r in rewrites if r]) if judge is not None else None
        vi = iter(verdicts or [])
        out = [([], "", {}) for _ in items]
        per: dict[int, list] = {}
        failed: dict[int, JudgeUnreachable] = {}
        for (k, s), text, reply in zip(jobs, rewrites, replies):
            verdict = next(vi) if (text and verdicts is not None) else True
            per.setdefault(k, []).append((s, text, verdict))
            failure = _unreachable([reply, verdict])
            if failure is not None:
                failed.setdefault(k, failure)
        for k, rec in enumerate(recs):
            if isinstance(rec, Malformed):
                out[k] = ([], f"malformed:{rec.reason}", rec.detail)
                continue
            if k in failed:
                out[k] = _retry(failed[k])
                continue
            rows, why = [], {}
            for s, text, verdict in per.get(k, []):
                if not text:
                    why[s] = "teacher_error_or_empty"
                elif verdict is None:
                    why[s] = "judge_unparseable"
                elif not verdict:
                    why[s] = "judge_rejected"
                else:
                    rows.append({"id": f"{rec.id}/{s}", "domain": rec.domain,
                                 "prompt": [{"role": "user", "content": text}],
                                 "metadata": {"seed_id": rec.id, "strategy": s}})
            out[k] = (rows, "kept", why or None) if rows else ([], "no_rewrite_kept", why)
        return out
    return step


def judge_batch(judge):
    """batch_step for `vt data judge`: keep prompts the judge calls GOOD."""
    def step(items):
        recs = [row_record(row, where, i) for i, where, row in items]
        ok = [k for k, r in enumerate(recs) if not isinstance(r, Malformed)]
        verdicts = dict(zip(ok, judge_queries(judge, [prompt_text(recs[k]) for k in ok])))
        out = []
        for k, (i, where, row) in enumerate(items):
            if isinstance(recs[k], Malformed):
                out.append(([], f"malformed:{recs[k].reason}", recs[k].detail))
            elif isinstance(verdicts[k], JudgeUnreachable):
                out.append(_retry(verdicts[k]))
            elif verdicts[k] is None:
                out.append(([], "judge_unparseable", None))
            else:
                out.append(([row], "kept", None) if verdicts[k] else ([], "judge_rejected", None))
        return out
    return step


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    k: Annotated[int, AT_LEAST_1] = 8  # teacher samples per query
    domain: str = ""  # "" = each row's own domain (ability); math, stem, code, instruct
    min_agreement: Annotated[float, FRACTION] = 0.5  # pseudo-label needs this share of the k samples
    use_reference: bool = True  # verify against ground_truth / tests when the row has them

    def __post_init__(self):
        check_fields(self)


def majority_label(answers: Sequence[str | None], k: int, min_agreement: float, equivalent=None):
    """(winning cluster id, its votes, per-sample clusters) or (None, reason, clusters).

    ``min_agreement`` is a share of all k samples (unanswered ones included): 3 of 8 agreeing is 0.375."""
    clusters = cluster_answers(answers, equivalent)
    votes: dict[int, int] = {}
    for c in clusters:
        if c is not None:
            votes[c] = votes.get(c, 0) + 1
    if not votes:
        return None, "no_answer", clusters
    ranked = sorted(votes.values(), reverse=True)
    top = max(votes, key=lambda c: (votes[c], -c))
    if len(ranked) > 1 and ranked[0] == ranked[1]:
        return None, "vote_tie", clusters
    if votes[top] < min_agreement * k - 1e-9:
        return None, "no_consensus", clusters
    return top, votes[top], clusters


def _has_reference(row: dict, domain: str) -> bool:
    if domain == "code":
        return "tests" in row
    if domain == "instruct":
        return "constraints" in row
    gt = row.get("ground_truth", (row.get("reward_model") or {}).get("ground_truth", row.get("answer")))
    return gt not in (None, "")


DISTILL_DOMAINS = ("math", "stem", "code", "instruct")


def distill_batch(teacher, cfg: DistillConfig, rewards):
    """batch_step for `vt data distill`. ``rewards``: domain -> RewardFunction (a mapping; opened and closed
    by the caller, possibly lazily)."""
    if cfg.k < 1 or not 0 < cfg.min_agreement <= 1:
        raise VtError(f"distill: need k >= 1 and 0 < min_agreement <= 1, got {cfg.k}, {cfg.min_agreement}")

    def step(items):
        recs = [row_record(row, where, i) for i, where, row in items]
        live = [k for k, r in enumerate(recs) if not isinstance(r, Malformed)]
        convs = [list(recs[k].prompt) for k in live for _ in range(cfg.k)]
        replies = teacher(convs) if convs else []
        if len(replies) != len(convs):
            raise VtError(f"teacher returned {len(replies)} replies for {len(convs)} conversations")
        out = []
        for k, (i, where, row) in enumerate(items):
            rec = recs[k]
            if isinstance(rec, Malformed):
                out.append(([], f"malformed:{rec.reason}", rec.detail))
                continue
            pos = live.index(k) * cfg.k
            failure = _unreachable(replies[pos:pos + cfg.k])
            if failure is not None:  # a vote over fewer samples would change the label: retry the whole row
                out.append(_retry(failure))
                continue
            texts = [None if isinstance(r, BaseException) else str(r) for r in replies[pos:pos + cfg.k]]
            out.append(_distill_one(cfg, rec, row, texts, rewards))
        return out
    return step


def _distill_one(cfg: DistillConfig, rec, row: dict, texts: list[str | None], rewards: dict):
    domain = cfg.domain or rec.domain
    if domain not in DISTILL_DOMAINS:
        return [], "unknown_domain", domain
    if all(t is None for t in texts):
        return [], "teacher_error", None
    reward = rewards[domain]
    if cfg.use_reference and _has_reference(row, domain):
        idx = [j for j, t in enumerate(texts) if t is not None]
        results = reward([row] * len(idx), [texts[j] for j in idx])
        keep = [j for j, r in zip(idx, results) if r.score == 1.0]
        label, source = rec.ground_truth, "reference"
        unknown = sum(r.is_verifier_error for r in results)
    elif domain in VOTABLE_DOMAINS:
        answers = [None if t is None else extract_answer(domain, t) for t in texts]
        eq = math_equivalence(reward) if domain == "math" else None
        top, votes, clusters = majority_label(answers, cfg.k, cfg.min_agreement, eq)
        if top is None:
            return [], votes, {"answers": [a for a in answers if a is not None][:cfg.k]}
        keep = [j for j, c in enumerate(clusters) if c == top]
        label, source, unknown = answers[keep[0]], "vote", 0
    else:
        return [], "no_reference", domain
    if not keep:
        return [], "no_verified_trace", {"verifier_errors": unknown} if unknown else None
    meta = {**rec.metadata, "prompt_id": rec.id, "pass_rate": len(keep) / cfg.k, "rollouts": cfg.k,
            "label_source": source}
    meta.pop("extra_info", None)
    rows = [{"id": f"{rec.id}/t{j}", "domain": domain,
             "messages": list(rec.prompt) + [{"role": "assistant", "content": texts[j]}],
             "ground_truth": label, "metadata": meta} for j in keep]
    return rows, "kept", None
