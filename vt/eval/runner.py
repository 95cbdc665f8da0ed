"""`vt eval`: sample n completions per problem, score them with vt.rewards, report pass@1 / pass@k / maj@k.

    summary = run_eval(cfg, out_dir)                      # loads cfg.model.ckpt through vt's sampler
    summary = run_eval(cfg, out_dir, generator=stand_in)  # any vt.eval.generation.Generator

Output directory:
    config.json     the settings that determine the results (a resume with different ones is refused)
    results.jsonl   one line per finished problem (samples with answer, score, failure, tokens, finish
                    reason[, text]; per-problem metrics; CLR picks), appended and fsynced as problems finish
                    (several processes: results.process-<i>.jsonl each; all of them are read on resume)
    summary.json, summary.md, plot.png   written at the end (by process 0)

Several processes (launched on every host of a pod): each takes every P-th chunk, generates it with its own
sampler on its own devices and scores it; process 0 summarises once all are done. A chunk's samples do not
depend on which process made it, so any process count (and a resume on another) gives the same results.

Resumable: problems are cut into fixed chunks of ``chunk_problems``; chunk c is generated with seed
``sampling.seed * 1_000_003 + c`` and sample j of problem i depends only on (seed, i, j), so a killed run
regenerates an unfinished chunk exactly and writes only its missing problems.

Verifier errors (a checker that failed: score None) are never counted as wrong: those samples are left
out of their problem's metrics and counted in the summary (``verifier_errors``); answers scored 0 because their check
or program ran out of time stay in the metrics and are counted too (``timeouts``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import jax
import numpy as np
from tqdm import tqdm

from vt import VtError
from vt.checkpoint.params import load_model
from vt.data.sources import Malformed, record_from_dict
from vt.data.tokenizer import build_tiny_tokenizer, load_tokenizer
from vt.distributed import barrier, is_primary, process_count, process_mesh
from vt.eval import metrics as M
from vt.eval.answers import VOTABLE_DOMAINS, extract_answer, math_equivalence
from vt.eval.clr import clr_for_rows
from vt.eval.generation import EngineGenerator, Generator
from vt.io import append_lines, exclusive, read_complete_jsonl, read_rows
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.rewards.registry import RewardsConfig, make_reward
from vt.sampling.config import SamplerConfig
from vt.sampling.engine import Engine
from vt.sharding import MeshConfig
from vt.validation import AT_LEAST_1, NON_NEGATIVE, check_fields
from vt.tracking import LoggingConfig
from vt.tracking.wandb import log_summary

log = logging.getLogger(__name__)

DOMAINS = ("math", "code", "stem", "instruct")
_GOLD = "\x00gold"  # cluster key shared by every verified-correct answer (all equal the ground truth)


@dataclasses.dataclass(frozen=True)
class EvalModelConfig:
    ckpt: str = ""  # vt checkpoint directory (`vt eval --ckpt` sets it)
    tokenizer: str = ""  # HF tokenizer directory
    preset: str = ""  # smoke only: random-init preset when ckpt is empty
    dtype: str = "bfloat16"  # compute dtype of the forward pass
    attention_impl: str = "xla"
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)


# The sampler's settings that change how fast samples come, not which: left out of the results' fingerprint.
_SAMPLER_SPEED_FIELDS = ("batch_size", "steps_per_call", "refill", "refill_min_free", "prefill_tokens",
                         "min_prompt_bucket", "min_prefill_rows", "page_size", "kv_pages", "kv_memory_fraction")


@dataclasses.dataclass(frozen=True)
class ClrConfig:
    enabled: bool = False
    K: Annotated[int, AT_LEAST_1] = 32  # trajectories per CLR run (disjoint slices of the n samples)
    M: Annotated[int, AT_LEAST_1] = 5  # claims per trajectory
    runs: Annotated[int, AT_LEAST_1] = 8  # independent runs averaged; needs runs * K <= n
    claim_max_new_tokens: Annotated[int, AT_LEAST_1] = 2048
    verify_max_new_tokens: Annotated[int, AT_LEAST_1] = 4096

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    name: str = "eval"
    data: str = ""  # .parquet (verl) or .jsonl
    domain: str = "math"  # reward domain: math, code, stem, instruct
    limit: Annotated[int, NON_NEGATIVE] = 0  # first N problems only (0 = all)
    system_prompt: str = ""  # prepended as a system message when non-empty
    prompt_suffix: str = ""  # appended to the last user message
    ks: Annotated[tuple[int, ...], AT_LEAST_1] = (1, 4, 16, 64)  # each <= sampling.n, checked below
    maj_ks: Annotated[tuple[int, ...], AT_LEAST_1] = (64,)
    chunk_problems: Annotated[int, AT_LEAST_1] = 8  # problems per generate call (also the resume unit)
    cluster_with_math_verify: bool = True  # merge wrong answers that math-verify finds equal before voting
    save_text: bool = True  # keep completion texts in results.jsonl
    progress: bool = True
    model: EvalModelConfig = EvalModelConfig()
    sampling: SamplerConfig = SamplerConfig(n=64, top_p=0.95, max_new_tokens=32768, batch_size=256)  # n per problem
    clr: ClrConfig = ClrConfig()
    rewards: RewardsConfig = RewardsConfig()  # the domain's options: rewards.math.workers, ...
    logging: LoggingConfig = LoggingConfig()

    def __post_init__(self):
        check_fields(self)
        if self.domain not in DOMAINS:
            raise VtError(f"config.domain: {self.domain!r} is not one of {DOMAINS}")
        for name in ("ks", "maj_ks"):
            bad = [k for k in getattr(self, name) if not 1 <= k <= self.sampling.n]
            if bad:
                raise VtError(f"config.{name}: {bad} not in [1, sampling.n = {self.sampling.n}]")
        if self.clr.enabled:
            if self.domain not in VOTABLE_DOMAINS:
                raise VtError(f"config.clr.enabled: CLR needs a domain with final answers {VOTABLE_DOMAINS}")
            if self.clr.runs * self.clr.K > self.sampling.n:
                raise VtError(f"config.clr: runs * K = {self.clr.runs * self.clr.K} must be <= sampling.n = "
                              f"{self.sampling.n} (each run uses its own K samples)")


def fingerprint(cfg: EvalConfig) -> dict:
    """The settings results depend on (not progress bars, worker counts or where the weights live)."""
    d = dataclasses.asdict(cfg)
    for k in ("progress", "save_text", "ks", "maj_ks", "logging"):
        d.pop(k)
    d["rewards"] = {k: v for k, v in d["rewards"][cfg.domain].items() if k != "workers"}  # the domain's
    d["model"] = {k: v for k, v in d["model"].items() if k in ("ckpt", "preset", "dtype")}
    for k in _SAMPLER_SPEED_FIELDS:
        d["sampling"].pop(k)
    return json.loads(json.dumps(d))


@dataclasses.dataclass(frozen=True)
class Problem:
    index: int
    id: str
    messages: list[dict]
    row: dict  # the raw row, as the reward function reads it
    ground_truth: Any


def load_problems(cfg: EvalConfig) -> list[Problem]:
    problems = []
    for i, (where, row) in enumerate(read_rows(cfg.data)):
        if cfg.limit and len(problems) >= cfg.limit:
            break
        rec = record_from_dict(row, where=where, default_id=str(i), default_domain=cfg.domain)
        if isinstance(rec, Malformed):
            raise VtError(str(rec))
        msgs = [dict(m) for m in rec.prompt]
        if not msgs or msgs[-1]["role"] != "user":
            raise VtError(f"{where}: the prompt must end with a user message")
        if cfg.prompt_suffix:
            msgs[-1] = {**msgs[-1], "content": msgs[-1]["content"] + cfg.prompt_suffix}
        if cfg.system_prompt:
            msgs = [{"role": "system", "content": cfg.system_prompt}] + [m for m in msgs if m["role"] != "system"]
        problems.append(Problem(i, rec.id, msgs, row, rec.ground_truth))
    if not problems:
        raise VtError(f"{cfg.data}: no problems")
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise VtError(f"{cfg.data}: problem ids are not unique (results are keyed by id)")
    return problems


def results_path(out_dir: Path, process_index: int, process_count: int) -> Path:
    """The results file this process appends to."""
    return out_dir / ("results.jsonl" if process_count == 1 else f"results.process-{process_index}.jsonl")


def read_results(out_dir: Path) -> dict[str, dict]:
    """Finished problems from every results file in `out_dir` (whatever process count wrote them)."""
    files = [out_dir / "results.jsonl"] + sorted(out_dir.glob("results.process-*.jsonl"))
    return {r["id"]: r for path in files for r in read_complete_jsonl(path)}


def _open_out(cfg: EvalConfig, out_dir: Path, primary: bool = True) -> dict[str, dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    fp = fingerprint(cfg)
    cfg_path = out_dir / "config.json"
    done = read_results(out_dir)
    # The settings guard results; a run that failed before its first result (a wrong --ckpt, a typo in a flag)
    # left nothing to guard, so its config.json is replaced instead of blocking the corrected re-run.
    if cfg_path.exists() and done:
        old = json.loads(cfg_path.read_text())
        if old != fp:
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            raise VtError(f"{cfg_path}: this output directory holds results of different settings "
                          f"(differs in {diff}); use another --out")
    elif primary:
        cfg_path.write_text(json.dumps(fp, indent=2) + "\n")
    return done


def _smoke_tokenizer(path: Path, vocab_size: int):
    """Built once per output directory: each process builds into its own temporary directory and renames it
    into place; a process that loses the race (the directory is there) uses the winner's."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        build_tiny_tokenizer(tmp, vocab_size=vocab_size)
        try:
            os.rename(tmp, path)
        except OSError:  # another process renamed first
            shutil.rmtree(tmp, ignore_errors=True)
    return load_tokenizer(path)


def build_generator(cfg: EvalConfig, out_dir: Path) -> Generator:
    """vt's sampler over cfg.model's checkpoint (or, for smoke tests, a random preset and a tiny tokenizer)."""
    m = cfg.model
    # This process's devices: with several processes each samples its own chunks (see the module docstring).
    mesh = process_mesh(m.mesh)
    mesh = None if mesh.size == 1 else mesh  # one device: nothing to shard
    if m.ckpt:
        model = load_model(m.ckpt, mesh=mesh, dtype=m.dtype, attention_impl=m.attention_impl)
    elif m.preset:
        model = create_model(preset(m.preset, dtype=m.dtype, attention_impl=m.attention_impl), mesh)
    else:
        raise VtError("config.model.ckpt: no checkpoint given (vt eval --ckpt DIR)")
    if m.tokenizer:
        tok = load_tokenizer(m.tokenizer)
    elif m.preset:  # smoke: a tiny tokenizer built on the spot
        tok = _smoke_tokenizer(out_dir / "tokenizer", model.cfg.vocab_size)
    else:
        raise VtError("config.model.tokenizer: no tokenizer directory given")
    # The tokenizer gives the engine its stop ids (its end-of-turn token); without it only Qwen's ids stop.
    return EngineGenerator(Engine(model, cfg.sampling, mesh=mesh, tokenizer=tok), tok, cfg.sampling.max_new_tokens)


def score_problem(cfg: EvalConfig, problem: Problem, completions, reward, equivalent) -> dict:
    """One results.jsonl row for a problem's completions."""
    results = reward([problem.row] * len(completions), [c.text for c in completions])
    samples = []
    for c, r in zip(completions, results):
        s = {"answer": extract_answer(cfg.domain, c.text), "score": r.score, "correct": r.score == 1.0,
             "failure": r.failure, "tokens": c.num_tokens, "finish": c.finish_reason}
        if cfg.domain == "instruct" and r.score is not None:  # IFEval's instruction-level verdicts
            s["strict"], s["loose"] = list(r.details["strict"]), list(r.details["loose"])
        if cfg.sampling.tools is not None:  # tool-integrated reasoning: its text is the final answer
            s["tool_calls"], s["tool_errors"] = c.tool_calls, c.tool_errors
        if cfg.save_text:
            s["text"] = c.text
        samples.append(s)
    clusters = vote_clusters(cfg, samples, equivalent)
    return {"index": problem.index, "id": problem.id, "ground_truth": problem.ground_truth, "samples": samples,
            "clusters": clusters, "metrics": sample_metrics(cfg, samples, clusters)}


def vote_keys(samples: list[dict]) -> list[str | None]:
    """Cluster keys: every correct sample shares one key (all equal the gold); others their answer."""
    return [_GOLD if s["correct"] else s["answer"] for s in samples]


def vote_clusters(cfg: EvalConfig, samples: list[dict], equivalent) -> list[int | None]:
    """Majority-vote cluster per sample (None: no answer, a verifier error, or a non-votable domain)."""
    if cfg.domain not in VOTABLE_DOMAINS:
        return [None] * len(samples)
    eq = None
    if equivalent is not None:
        eq = lambda a, b: a != _GOLD and b != _GOLD and equivalent(a, b)  # noqa: E731
    keys = [None if s["failure"] == "verifier_error" else k for s, k in zip(samples, vote_keys(samples))]
    return M.cluster_answers(keys, eq)


def sample_metrics(cfg: EvalConfig, samples: list[dict], clusters: list[int | None]) -> dict:
    """Per-problem metrics over the samples whose verdict is known (verifier errors left out, counted)."""
    keep = [i for i, s in enumerate(samples) if s["failure"] != "verifier_error"]
    out: dict[str, Any] = {"n": len(samples), "verifier_errors": len(samples) - len(keep),
                           "timeouts": sum(s["failure"] == "timeout" for s in samples)}  # wrong (0) by timeout
    if not keep:
        return out
    valid = [samples[i] for i in keep]
    ks = [k for k in cfg.ks if k <= len(valid)]
    maj_ks = [k for k in cfg.maj_ks if k <= len(valid)] if cfg.domain in VOTABLE_DOMAINS else []
    out.update(M.problem_metrics([s["correct"] for s in valid], [clusters[i] for i in keep],
                                 [s["finish"] for s in valid], [s["tokens"] for s in valid], ks, maj_ks))
    return out


def run_eval(cfg: EvalConfig, out_dir: str | Path, generator: Generator | None = None, reward=None) -> dict:
    """Evaluate (or finish evaluating) ``cfg`` into ``out_dir``; returns the summary."""
    out_dir = Path(out_dir)
    problems = load_problems(cfg)
    # Locked for the whole run: two evaluations appending to one results.jsonl would duplicate and mix rows.
    with exclusive(out_dir, "output", inside=True, enabled=is_primary()):
        return _run_eval(cfg, out_dir, problems, generator, reward)


def _run_eval(cfg: EvalConfig, out_dir: Path, problems, generator: Generator | None, reward) -> dict:
    count = process_count()
    index = jax.process_index() if count > 1 else 0
    done = _open_out(cfg, out_dir, primary=is_primary())
    barrier("vt-eval-open")  # every process has read the earlier results before any appends
    unknown = sorted(set(done) - {p.id for p in problems})
    if unknown:
        raise VtError(f"{out_dir / 'results.jsonl'}: holds problem ids not in {cfg.data}: {unknown[:3]}")
    todo_chunks = sorted({p.index // cfg.chunk_problems for p in problems if p.id not in done})
    todo_chunks = [c for c in todo_chunks if c % count == index]  # every P-th chunk is this process's
    own_reward, own_generator = reward is None, generator is None
    if own_reward:
        reward = make_reward(cfg.domain, cfg.rewards)
    try:
        equivalent = None
        if cfg.domain == "math" and cfg.cluster_with_math_verify:
            equivalent = math_equivalence(reward)
        if todo_chunks and generator is None:
            generator = build_generator(cfg, out_dir)
        if count == 1:
            bar = tqdm(total=len(problems), initial=len(done), desc=f"eval {cfg.name}", unit="problem",
                       disable=not cfg.progress)
        else:
            mine = sum(1 for p in problems if p.index // cfg.chunk_problems in todo_chunks and p.id not in done)
            bar = tqdm(total=mine, desc=f"eval {cfg.name} (process {index} of {count})", unit="problem",
                       disable=not cfg.progress)
        with open(results_path(out_dir, index, count), "a", encoding="utf-8") as f:
            for c in todo_chunks:
                chunk = [p for p in problems if p.index // cfg.chunk_problems == c]
                seed = cfg.sampling.seed * 1_000_003 + c
                completions = generator.generate([p.messages for p in chunk], cfg.sampling.n, seed)
                if len(completions) != len(chunk) or any(len(x) != cfg.sampling.n for x in completions):
                    raise VtError(f"generator returned {[len(x) for x in completions]} samples for "
                                  f"{len(chunk)} problems, expected {cfg.sampling.n} each")
                rows = [score_problem(cfg, p, comps, reward, equivalent) for p, comps in zip(chunk, completions)]
                if cfg.clr.enabled:
                    clr_for_rows(cfg.clr, generator, chunk, rows, completions, seed)
                for p, row in zip(chunk, rows):
                    if p.id not in done:
                        append_lines(f, [row])
                        done[p.id] = row
                        bar.update(1)
        bar.close()
        if count > 1:
            barrier("vt-eval-done")
            done = read_results(out_dir)
        summary = summarize(cfg, [done[p.id] for p in problems])
    finally:
        if own_reward:
            reward.close()
        if own_generator and generator is not None:
            generator.close()
    if is_primary():
        write_report(cfg, summary, out_dir)
        log_summary(cfg.logging, out_dir, summary, config=dataclasses.asdict(cfg), job_type="eval", name=cfg.name)
    return summary


def summarize(cfg: EvalConfig, rows: list[dict]) -> dict:
    recomputed = [sample_metrics(cfg, r["samples"], r["clusters"]) for r in rows]  # ks may differ from the run's
    per_problem = [{k: v for k, v in m.items() if k not in ("n", "verifier_errors", "timeouts")} for m in recomputed]
    scored = [m for m in per_problem if m]
    summary: dict[str, Any] = {"name": cfg.name, "data": cfg.data, "n": cfg.sampling.n, **M.mean_over_problems(scored)}
    summary["problems"] = len(rows)
    summary["problems_unscored"] = len(rows) - len(scored)
    summary["verifier_errors"] = sum(m["verifier_errors"] for m in recomputed)
    summary["timeouts"] = sum(m["timeouts"] for m in recomputed)  # samples scored 0 because their check timed out
    if cfg.sampling.tools is not None:
        calls = np.array([[s["tool_calls"], s["tool_errors"]] for r in rows for s in r["samples"]]).reshape(-1, 2)
        # the share of samples that called a tool and got no error turn, and the calls a sample made
        summary["tool_call_share"] = float(((calls[:, 0] > 0) & (calls[:, 1] == 0)).mean()) if len(calls) else 0.0
        summary["tool_calls_mean"] = float(calls[:, 0].mean()) if len(calls) else 0.0
    if cfg.domain == "instruct":
        summary.update(ifeval_scores([s for r in rows for s in r["samples"] if "strict" in s]))
    if cfg.clr.enabled:
        accs = [run["correct"] for r in rows for run in r.get("clr", [])]
        per_problem_clr = [sum(run["correct"] for run in r["clr"]) / len(r["clr"]) for r in rows if r.get("clr")]
        summary[f"clr@{cfg.clr.K}"] = float(sum(per_problem_clr) / len(per_problem_clr)) if per_problem_clr else 0.0
        summary["clr_runs"] = len(accs)
    return summary


def ifeval_scores(samples: list[dict]) -> dict[str, float]:
    """IFEval's four numbers over all samples: prompt level (every instruction met) and instruction level
    (fraction of all instructions met), strict and loose."""
    if not samples:
        return {}
    out = {}
    for mode in ("strict", "loose"):
        out[f"prompt_{mode}"] = sum(all(s[mode]) for s in samples) / len(samples)
        flat = [v for s in samples for v in s[mode]]
        out[f"inst_{mode}"] = sum(flat) / len(flat)
    return out


def _fmt(v) -> str:
    return f"{100 * v:.2f}" if isinstance(v, float) else str(v)


def write_report(cfg: EvalConfig, summary: dict, out_dir: Path) -> None:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    metric_keys = [k for k in summary if k == "avg@n" or k.startswith(("pass@", "maj@", "clr@", "prompt_", "inst_"))]
    cols = ["benchmark", "problems", *metric_keys, "truncated %", "mean tokens", "verifier errors"]
    vals = [cfg.name, str(summary["problems"]), *[_fmt(summary[k]) for k in metric_keys],
            _fmt(summary.get("truncated", float("nan"))), f"{summary.get('mean_tokens', float('nan')):.1f}",
            str(summary["verifier_errors"])]
    table = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n| " + " | ".join(vals) + " |\n"
    (out_dir / "summary.md").write_text(
        f"# {cfg.name}: n = {cfg.sampling.n} samples per problem (metrics in %)\n\n{table}")
    plot_summary(summary, out_dir / "plot.png")


def plot_summary(summary: dict, path: Path) -> None:
    import matplotlib  # optional extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for prefix, style in (("pass@", "o-"), ("maj@", "s--")):
        pts = sorted((int(k[len(prefix):]), v) for k, v in summary.items() if k.startswith(prefix))
        if pts:
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], style, label=prefix.rstrip("@") + "@k")
    for k, v in summary.items():
        if k.startswith("clr@"):
            ax.axhline(100 * v, color="tab:red", ls=":", label=k)
    ax.axhline(100 * summary.get("avg@n", 0.0), color="gray", ls=":", label="avg@n (pass@1)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("%")
    ax.set_title(f"{summary['name']} ({summary['problems']} problems, n={summary['n']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
