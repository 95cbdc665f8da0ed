"""What a recipe run reports: the held-out accuracy table (`table.md`, printed once, at the end), `summary.json`,
`plot.png` (RL reward and held-out accuracy) and `tb/` (the same, for TensorBoard; every learner writes its own
`tb/` in its stage directory), `final` (a link to the final checkpoint), the closing lines that say where each
result is, and the `--validate` printout."""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

from vt.io import atomic_write_json
from vt.recipe.stages import RecipeConfig
from vt.rl.opd import tokens_to_reach

log = logging.getLogger(__name__)


def table_rows(manifests: list[dict]) -> tuple[list[str], list[tuple[str, dict, float]]]:
    domains = sorted({d for m in manifests for d in m.get("heldout", {})})
    rows = [(m["stage"], m.get("heldout", {}), m.get("wall_s", 0.0)) for m in manifests if m.get("heldout")]
    return domains, rows


def format_table(manifests: list[dict], cfg: RecipeConfig | None = None) -> str:
    domains, rows = table_rows(manifests)
    if not rows:
        return "held-out accuracy: no stage that trains a model has finished yet"
    head = "| stage | " + " | ".join(domains) + " | mean | stage s |"
    sampler = cfg.probe.sampler if cfg else None
    lines = ["held-out accuracy (avg@n per domain)" + (f", {sampler.n} samples/prompt at T={sampler.temperature}"
                                                       if sampler else ""),
             head, "|" + "---|" * (len(domains) + 3)]
    for stage, acc, wall in rows:
        vals = [acc.get(d) for d in domains]
        # the mean of the accuracies (not of the tool-use shares, "tool_calls_ok/<domain>", beside them)
        accs = [v for d, v in zip(domains, vals) if v is not None and "/" not in d]
        mean = sum(accs) / max(1, len(accs))
        lines.append(f"| {stage} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in vals) +
                     f" | {mean:.3f} | {wall:.0f} |")
    return "\n".join(lines)


def rl_curves(workdir: Path, manifests: list[dict]) -> list[tuple[str, list[dict]]]:
    """(stage, metrics rows with a reward) for every stage that logged RL steps, in order."""
    out = []
    for m in manifests:
        path = workdir / m["stage"] / "metrics.jsonl"
        if path.is_file():
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            rows = [r for r in rows if "reward_mean" in r]
            if rows:
                out.append((m["stage"], rows))
    return out


def final_checkpoint_of(workdir: Path, manifests: list[dict]) -> Path | None:
    """The checkpoint the last finished model stage left (manifests name it relative to the work directory)."""
    for m in reversed(manifests):
        if m.get("checkpoint"):
            return workdir / m["checkpoint"]
    return None


def write_outputs(workdir: Path, cfg: RecipeConfig, manifests: list[dict], out) -> None:
    table = format_table(manifests, cfg)
    (workdir / "table.md").write_text(table + "\n")
    final = final_checkpoint_of(workdir, manifests)
    summary = {"stages": [{k: m.get(k) for k in ("stage", "wall_s", "checkpoint", "heldout", "metrics")}
                          for m in manifests],
               "final_checkpoint": str(final.relative_to(workdir)) if final else None,
               "total_wall_s": round(sum(m.get("wall_s", 0.0) for m in manifests), 1)}
    atomic_write_json(workdir / "summary.json", summary)
    link = workdir / "final"
    if link.is_symlink():
        link.unlink()
    if final is not None and not link.exists():  # `<workdir>/final`: a path that never changes, for every command
        os.symlink(os.path.relpath(final, workdir), link)
    try:
        plot(workdir, manifests)
        write_tensorboard(workdir, manifests)
    except ImportError as e:  # matplotlib / tensorboardX are optional for a headless run
        log.warning("plots skipped: %s", e)
    out(table)
    for line in closing_lines(workdir, manifests, final):
        out(line)


def _shown(path: Path) -> str:
    """`path` as the user can type it: relative to the current directory when it lies below it."""
    try:
        return str(Path(path).absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def viewer_command(logdir: Path) -> str:
    """A TensorBoard command that works here: the tensorboard beside this Python (the demo extra installs it),
    else on PATH, else how to install it."""
    beside = Path(sys.executable).parent / "tensorboard"
    exe = _shown(beside) if beside.is_file() else shutil.which("tensorboard")
    if exe is None:
        return f"pip install tensorboard && tensorboard --logdir {_shown(logdir)}"
    return f"{exe} --logdir {_shown(logdir)}"


def closing_lines(workdir: Path, manifests: list[dict], final: Path | None) -> list[str]:
    """Where every result is: the final checkpoint, the export and its transformers check, the eval summaries, the
    plot and a viewer command."""
    by = {m["stage"]: m for m in manifests}
    lines = [f"[pipeline] {len(manifests)} stages, {sum(m.get('wall_s', 0.0) for m in manifests):.0f} s of stage "
             f"time; results in {_shown(workdir)} (vt info {_shown(workdir)} lists them)"]
    if final is not None:
        lines.append(f"  final checkpoint   {_shown(workdir / 'final')} -> {_shown(final)}")
    if "export" in by:
        x = by["export"]["metrics"]
        checks = ", ".join(f"{k.replace('_', ' ')} {x[k]}" for k in ("tokenizer_match", "greedy_match",
                                                                       "stopped_at_end_of_turn") if k in x)
        lines.append(f"  Hugging Face       {_shown(Path(x['hf_dir']))}" +
                     (f"  (transformers check: {checks})" if checks else ""))
    for name, summary in (by.get("eval", {}).get("metrics") or {}).items():
        keys = [k for k in summary if k.startswith(("pass@", "maj@", "prompt_strict"))]
        lines.append(f"  eval {name:13s} " + "  ".join(f"{k} {100 * summary[k]:.1f}%" for k in keys) +
                     f"  ({_shown(workdir / 'eval' / name / 'summary.md')})")
    lines += distillation_lines(manifests)
    if (workdir / "plot.png").is_file():
        lines.append(f"  plot               {_shown(workdir / 'plot.png')}")
    lines.append(f"  TensorBoard        {viewer_command(workdir)}")
    return lines


def distillation_lines(manifests: list[dict]) -> list[str]:
    """On-policy distillation (opd) and SFT on the teacher's samples (opd_sft): each one's held-out accuracy
    against the teacher tokens spent so far, and how many it took to come within 0.05 of the teacher."""
    curves = {m["stage"]: m["metrics"]["heldout_vs_teacher_tokens"] for m in manifests
              if (m.get("metrics") or {}).get("heldout_vs_teacher_tokens")}
    lines = [f"  {stage + ' held-out':18s} " + "  ".join(f"{int(t)} tok: {a:.3f}" for t, a in curve)
             for stage, curve in curves.items()]
    teacher = next((m["metrics"]["teacher_heldout"] for m in manifests
                    if "teacher_heldout" in (m.get("metrics") or {})), None)
    if teacher is not None:
        reach = {s: tokens_to_reach(c, teacher - 0.05) for s, c in curves.items()}
        lines.append(f"  teacher held-out   {teacher:.3f}; within 0.05 of it after " + ", ".join(
            f"{s}: {'not within its ' + str(int(curves[s][-1][0])) + ' tokens' if t is None else f'{int(t)} tokens'}"
            for s, t in reach.items()))
    return lines


def plot(workdir: Path, manifests: list[dict]) -> Path:
    import matplotlib  # optional extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = {m["stage"]: m["metrics"]["heldout_vs_teacher_tokens"] for m in manifests
              if (m.get("metrics") or {}).get("heldout_vs_teacher_tokens")}
    fig, (a, b, *c) = plt.subplots(1, 2 + bool(curves), figsize=(12 + 6 * bool(curves), 4))
    offset = 0
    for stage, rows in rl_curves(workdir, manifests):
        xs = [offset + r["step"] for r in rows]
        a.plot(xs, [r["reward_mean"] for r in rows], label=stage)
        offset = xs[-1] if xs else offset
    a.set_xlabel("RL step (stages concatenated)")
    a.set_ylabel("mean reward of the rollouts")
    a.set_title("RL training reward")
    if a.lines:
        a.legend(fontsize=8)
    domains, rows = table_rows(manifests)
    for d in domains:
        b.plot(range(len(rows)), [acc.get(d, float("nan")) for _, acc, _ in rows], marker="o", label=d)
    b.set_xticks(range(len(rows)), [s for s, _, _ in rows], rotation=35, ha="right", fontsize=8)
    b.set_ylabel("held-out accuracy")
    b.set_ylim(0, 1)
    b.set_title("held-out accuracy after each stage")
    if domains:
        b.legend(fontsize=8)
    for stage, curve in curves.items():  # on-policy distillation's learning curve, and SFT on teacher samples'
        c[0].plot([t for t, _ in curve], [acc for _, acc in curve], marker="o", label=stage)
        c[0].set_xlabel("teacher tokens (scored by the teacher: opd; sampled from it: opd_sft)")
        c[0].set_ylabel("held-out accuracy")
        c[0].set_title("student's held-out accuracy vs teacher tokens")
    for m in manifests:
        if "teacher_heldout" in (m.get("metrics") or {}):
            c[0].axhline(m["metrics"]["teacher_heldout"], color="k", ls="--", lw=1, label="teacher")
    if curves:
        c[0].legend(fontsize=8)
    fig.tight_layout()
    path = workdir / "plot.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_tensorboard(workdir: Path, manifests: list[dict]) -> None:
    from tensorboardX import SummaryWriter  # optional extra
    shutil.rmtree(workdir / "tb", ignore_errors=True)
    w = SummaryWriter(str(workdir / "tb"))
    _, rows = table_rows(manifests)
    for i, (stage, acc, _) in enumerate(rows):
        for d, v in acc.items():
            w.add_scalar(f"heldout_accuracy/{d}", v, i)
    offset = 0
    for stage, rl_rows in rl_curves(workdir, manifests):
        for r in rl_rows:
            w.add_scalar("rl/reward_mean", r["reward_mean"], offset + r["step"])
            if "accuracy" in r:
                w.add_scalar("rl/accuracy", r["accuracy"], offset + r["step"])
        offset += rl_rows[-1]["step"]
    w.close()


def print_validation(report: dict, out=print) -> bool:
    for stage in report["stages"]:
        out(f"  {stage}: config ok")
    if report["problems"]:
        out(f"{len(report['problems'])} problem(s):")
        for p in report["problems"]:
            out(f"  {p}")
        return False
    out("all inputs present; every stage config is valid")
    return True
