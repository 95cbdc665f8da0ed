"""Offline self-distillation (RECIPE stage 4), resumable in a work directory:

  1. sample: for each domain with an RL checkpoint, sample n traces per prompt and score them with the
     domain's verifier (vt.eval.runner, so this step resumes by chunk) -> ``samples_<domain>/``;
  2. keep verified-correct traces only; score each with the student's S_LP (vt.distill.scoring) ->
     ``scores.jsonl``, appended per batch, already-scored traces skipped on resume;
  3. select by domain, length bucket and S_LP band, mix domains (vt.distill.selection) ->
     ``selected.jsonl`` (chat records for `vt train`) and ``selection_report.json``.

    vt self-distill --config configs/self_distill.py --workdir runs/self_distill
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Annotated

from tqdm import tqdm

from vt import VtError
from vt.checkpoint.params import load_model
from vt.data.tokenizer import load_tokenizer
from vt.distill.scoring import Scorer, ScoringConfig
from vt.distill.selection import DomainRule, ScoredTrace, select
from vt.distributed import barrier, is_primary, process_mesh
from vt.eval.runner import EvalConfig, EvalModelConfig, load_problems, read_results, run_eval
from vt.io import append_lines, atomic_write_json, read_complete_jsonl, write_jsonl
from vt.rewards.registry import RewardsConfig
from vt.sampling.config import SamplerConfig
from vt.sharding import MeshConfig
from vt.validation import AT_LEAST_1, NON_NEGATIVE, check_fields

log = logging.getLogger(__name__)
DOMAINS = ("math", "code", "stem")


@dataclasses.dataclass(frozen=True)
class Source:
    ckpt: str = ""  # the domain's RL checkpoint ("" = domain not used)
    data: str = ""  # prompts with verifiable references (verl parquet or JSONL)
    n: Annotated[int, AT_LEAST_1] = 8  # samples per prompt
    limit: Annotated[int, NON_NEGATIVE] = 0  # first N prompts (0 = all)

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class Sources:
    math: Source = Source()
    code: Source = Source()
    stem: Source = Source()


@dataclasses.dataclass(frozen=True)
class Rules:
    math: DomainRule = DomainRule()
    code: DomainRule = DomainRule()
    stem: DomainRule = DomainRule()


@dataclasses.dataclass(frozen=True)
class Selection:
    rules: Rules = Rules()
    total: Annotated[int, NON_NEGATIVE] = 0  # traces in the mixed set (0 = every in-band trace)
    seed: Annotated[int, NON_NEGATIVE] = 0

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class SelfDistillConfig:
    student: str = ""  # the student checkpoint that scores traces (and is then fine-tuned)
    tokenizer: str = ""  # HF tokenizer directory shared by teachers and student
    dtype: str = "bfloat16"
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)
    sources: Sources = Sources()
    sampling: SamplerConfig = SamplerConfig(n=8, top_p=0.95, max_new_tokens=32768, batch_size=256)
    scoring: ScoringConfig = ScoringConfig()
    selection: Selection = Selection()
    rewards: RewardsConfig = RewardsConfig()  # the verifiers' options: rewards.math.workers, ...
    progress: bool = True

    def __post_init__(self):
        check_fields(self)


def sample_config(cfg: SelfDistillConfig, domain: str, src: Source) -> EvalConfig:
    return EvalConfig(name=f"self_distill_{domain}", data=src.data, domain=domain, limit=src.limit, ks=(1,),
                      maj_ks=(), cluster_with_math_verify=False, save_text=True, rewards=cfg.rewards,
                      progress=cfg.progress, sampling=dataclasses.replace(cfg.sampling, n=src.n),
                      model=EvalModelConfig(ckpt=src.ckpt, tokenizer=cfg.tokenizer, dtype=cfg.dtype, mesh=cfg.mesh))


def verified_traces(workdir: Path, cfg: SelfDistillConfig, generators=None, rewards=None) -> list[dict]:
    """Step 1 and the correctness filter: [{id, domain, prompt_id, messages, text, ckpt}]."""
    traces = []
    for domain in DOMAINS:
        src: Source = getattr(cfg.sources, domain)
        if not src.ckpt and not (generators and domain in generators):
            continue
        if not src.data:
            raise VtError(f"config.sources.{domain}.data: no prompt file for the {domain} checkpoint")
        ecfg = sample_config(cfg, domain, src)
        out = workdir / f"samples_{domain}"
        run_eval(ecfg, out, generator=(generators or {}).get(domain), reward=(rewards or {}).get(domain))
        problems = {p.id: p for p in load_problems(ecfg)}
        # Prompt order, whatever process (count) wrote which results file.
        for row in sorted(read_results(out).values(), key=lambda r: r["index"]):
            for j, s in enumerate(row["samples"]):
                if s["correct"] and s["finish"] == "stop":
                    traces.append({"id": f"{domain}/{row['id']}/{j}", "domain": domain, "prompt_id": row["id"],
                                   "messages": problems[row["id"]].messages, "text": s["text"],
                                   "ckpt": src.ckpt})
    return traces


def score_traces(workdir: Path, traces: list[dict], scorer: Scorer, tokenizer, batch: int = 256,
                 progress: bool = True) -> dict[str, dict]:
    """Step 2, resumable: {trace id: {"s_lp", "length"}} (``scores.jsonl``)."""
    path = workdir / "scores.jsonl"
    done = {r["id"]: r for r in read_complete_jsonl(path)}
    todo = [t for t in traces if t["id"] not in done]
    im_end = tokenizer.token_to_id("<|im_end|>")
    end = [im_end] if im_end is not None else []
    with open(path, "a", encoding="utf-8") as f, tqdm(total=len(traces), initial=len(traces) - len(todo),
                                                      desc="S_LP", unit="trace",
                                                      disable=not progress) as bar:
        for i in range(0, len(todo), batch):
            part = todo[i:i + batch]
            prompts = [tokenizer.encode_chat(t["messages"], add_generation_prompt=True) for t in part]
            comps = [tokenizer.encode(t["text"]) + end for t in part]  # SFT trains the turn's end too
            nll = scorer.nll(prompts, comps)
            rows = [{"id": t["id"], "s_lp": float(s), "length": len(c)} for t, s, c in zip(part, nll, comps)]
            append_lines(f, rows)
            done.update((r["id"], r) for r in rows)
            bar.update(len(part))
    return done


def run_self_distill(cfg: SelfDistillConfig, workdir: str | Path, *, generators=None, rewards=None,
                     student=None, tokenizer=None) -> dict:
    """All three steps; ``generators`` / ``rewards`` / ``student`` / ``tokenizer`` replace what the config
    would load (tests, notebooks). Returns the selection report.

    Several processes: all of them sample (step 1 splits the prompts, see vt.eval.runner); scoring and
    selection then run on process 0 with its own devices, the others wait for it and return its report."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    traces = verified_traces(workdir, cfg, generators, rewards)
    if not is_primary():
        barrier("vt-self-distill-selected")
        return json.loads((workdir / "selection_report.json").read_text())
    try:
        return _score_and_select(cfg, workdir, traces, student, tokenizer)
    finally:
        barrier("vt-self-distill-selected")


def _score_and_select(cfg: SelfDistillConfig, workdir: Path, traces: list[dict], student, tokenizer) -> dict:
    if not traces:
        raise VtError("self-distillation: no verified-correct trace was sampled (check the checkpoints and data)")
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.tokenizer)
    mesh = None
    if student is None:
        mesh = process_mesh(cfg.mesh)  # process 0's own devices: the others do not take part in scoring
        mesh = None if mesh.size == 1 else mesh  # one device: nothing to shard
        student = load_model(cfg.student, mesh=mesh, dtype=cfg.dtype)
    scores = score_traces(workdir, traces, Scorer(student, cfg.scoring, mesh), tokenizer, progress=cfg.progress)
    scored = [ScoredTrace(t["id"], t["domain"], scores[t["id"]]["length"], scores[t["id"]]["s_lp"]) for t in traces]
    rules = {d: getattr(cfg.selection.rules, d) for d in DOMAINS}
    chosen, report = select(scored, rules, cfg.selection.total, cfg.selection.seed)
    by_id = {t["id"]: t for t in traces}
    write_jsonl(workdir / "selected.jsonl", (
        {"id": s.id, "domain": s.domain,
         "messages": by_id[s.id]["messages"] + [{"role": "assistant", "content": by_id[s.id]["text"]}],
         "metadata": {"prompt_id": f"{s.domain}/{by_id[s.id]['prompt_id']}", "s_lp": s.score,
                      "trace_length": s.length, "source_ckpt": by_id[s.id]["ckpt"]}}
        for s in chosen))
    report["verified_traces"] = len(traces)
    atomic_write_json(workdir / "selection_report.json", report)
    return report
