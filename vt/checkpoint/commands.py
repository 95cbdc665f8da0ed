"""`vt convert` and `vt info`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from vt import VtError
from vt.checkpoint.seal import add_trust_flag, verify_seal
from vt.validation import positive_float, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert checkpoints between Hugging Face and Orbax format")
    sub = p.add_subparsers(dest="direction", required=True)
    h2o = sub.add_parser("hf-to-orbax", help="HF_DIR (config.json + safetensors) -> vt checkpoint")
    h2o.add_argument("hf_dir", type=Path)
    h2o.add_argument("ckpt_dir", type=Path)
    h2o.add_argument("--param-dtype", choices=["float32", "bfloat16"], default=None,
                     help="dtype to store parameters in (default float32)")
    h2o.add_argument("--max-position-embeddings", type=positive_int, default=None,
                     help="context length to record instead of config.json's (weights and rope_theta unchanged): "
                          "extends a short-context base, e.g. Qwen2.5-Math-1.5B's 4096 (configs/vibethinker_1p5b.py)")
    add_trust_flag(h2o)
    h2o.set_defaults(func=_hf_to_orbax)
    o2h = sub.add_parser("orbax-to-hf", help="vt checkpoint -> HF directory loadable by transformers")
    o2h.add_argument("ckpt_dir", type=Path)
    o2h.add_argument("hf_dir", type=Path)
    o2h.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                     help="safetensors dtype (default: the checkpoint's param_dtype, so nothing is lost)")
    tok = o2h.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", type=Path, default=None,
                     help="the model's tokenizer: an HF tokenizer directory or a SentencePiece .model file; written "
                          "as HF tokenizer files (tokenizer.json, tokenizer_config.json with the chat template) and "
                          "its eos / pad ids into config.json and generation_config.json")
    tok.add_argument("--no-tokenizer", action="store_true",
                     help="export the weights without a tokenizer (AutoTokenizer will not load the directory, and "
                          "generate() will not know where a turn ends)")
    o2h.add_argument("--max-shard-gb", type=positive_float, default=2.0)
    o2h.add_argument("--lora-format", choices=["merged", "peft"], default="merged",
                     help="a LoRA checkpoint: merged = the adapters folded into the weights (a plain model, the "
                          "default); peft = a PEFT adapter directory, with the frozen base model in base_model/")
    add_trust_flag(o2h)
    o2h.set_defaults(func=_orbax_to_hf)

    info = subparsers.add_parser("info", help="describe a vt checkpoint, HF model directory, training workdir or "
                                              "pipeline (vt demo) work directory")
    info.add_argument("path", type=Path)
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_trust_flag(info)
    info.set_defaults(func=_info)


def _hf_to_orbax(args: argparse.Namespace) -> int:
    from vt.checkpoint.params import import_from_hf
    from vt.model.config import param_count
    cfg = import_from_hf(args.hf_dir, args.ckpt_dir, param_dtype=args.param_dtype,
                         max_position_embeddings=args.max_position_embeddings)
    print(f"wrote {args.ckpt_dir} ({param_count(cfg):,} parameters, {cfg.param_dtype})")
    return 0


def _orbax_to_hf(args: argparse.Namespace) -> int:
    from vt.checkpoint.params import export_peft, export_to_hf, load_model
    from vt.data.tokenizer import load_tokenizer
    if args.tokenizer is None and not args.no_tokenizer:
        raise VtError("vt convert orbax-to-hf: pass --tokenizer TOKENIZER (the model's: an HF tokenizer directory "
                      "or a SentencePiece .model), or --no-tokenizer to export the weights alone")
    tok = load_tokenizer(args.tokenizer) if args.tokenizer is not None else None  # before the model: fail fast
    model = load_model(args.ckpt_dir)
    export = export_peft if args.lora_format == "peft" else export_to_hf
    export(model, args.hf_dir, dtype=args.dtype, tokenizer=tok, max_shard_bytes=int(args.max_shard_gb * (1 << 30)))
    print(f"wrote {args.hf_dir} ({args.dtype or model.cfg.param_dtype}" +
          (f", tokenizer from {args.tokenizer})" if tok is not None else ", no tokenizer)"))
    if tok is not None and tok.kind == "spm":
        print(f"note: a SentencePiece tokenizer is written as tokenizer.json, which transformers 4.x AutoTokenizer "
              f"loads; transformers >= 5 builds any qwen2 model's tokenizer as Qwen2's byte-level BPE (other ids), so "
              f"there load it with PreTrainedTokenizerFast.from_pretrained({str(args.hf_dir)!r})")
    return 0


def describe(path: Path) -> dict:
    """Config, parameter count, and per-tensor shapes/dtypes, read from metadata only (no weights loaded), after
    verifying the checkpoint's seal (a Hugging Face directory from elsewhere has none and is described as is)."""
    from vt.model.config import PRESETS, architecture, param_count
    path = Path(path)
    if (path / "config.json").is_file() and not (path / "model_config.json").is_file():
        verify_seal(path, f"Hugging Face directory {path}", required=False)
        from vt.checkpoint.hf_dir import SafetensorsReader, read_hf_config
        cfg = read_hf_config(path)
        reader = SafetensorsReader(path)
        tensors = {}
        for k in reader.keys():
            sl = reader._handles[reader.key_file[k]].get_slice(k)
            tensors[k] = {"shape": list(sl.get_shape()), "dtype": str(sl.get_dtype())}
        fmt = "huggingface"
    else:
        from vt.checkpoint.params import PARAMS_ITEM, load_model_config, stored_param_metadata
        cfg = load_model_config(path)
        verify_seal(path, f"checkpoint {path}")
        meta = stored_param_metadata(path / PARAMS_ITEM)
        tensors = {k: {"shape": list(m.shape), "dtype": str(m.dtype)} for k, m in meta.items()}
        fmt = "vt-orbax"
    arch = architecture(cfg)
    matches = [name for name, p in PRESETS.items() if architecture(p) == arch]
    return {"path": str(path), "format": fmt, "preset": matches[0] if matches else None, "config": cfg.to_dict(),
            "param_count": param_count(cfg), "dtypes": sorted({t["dtype"] for t in tensors.values()}),
            "tensors": tensors}


def describe_run(path: Path) -> dict:
    """A training workdir (vt.checkpoint.manager.is_run_dir): its learner, its sealed steps, and the newest one,
    the model checkpoint the other commands take."""
    from vt.checkpoint.workdir import CHECKPOINTS_DIR
    from vt.checkpoint.seal import sealed_steps
    path = Path(path)
    try:
        learner = json.loads((path / "config.json").read_text()).get("learner")
    except (OSError, ValueError, AttributeError):
        learner = None
    steps = sealed_steps(path / CHECKPOINTS_DIR)
    metrics = path / "metrics.jsonl"
    return {"path": str(path), "format": "vt-workdir", "learner": learner, "steps": steps,
            "newest_checkpoint": str(path / CHECKPOINTS_DIR / str(steps[-1])) if steps else None,
            "metrics_lines": sum(1 for line in metrics.open("rb") if line.strip()) if metrics.is_file() else 0}


def _print_run(d: dict) -> None:
    print(f"{d['path']}  [training workdir, learner {d['learner'] or 'unknown'}]")
    print(f"metrics.jsonl: {d['metrics_lines']} lines")
    if not d["steps"]:
        print("no sealed checkpoint yet")
        return
    print(f"sealed steps: {', '.join(map(str, d['steps']))}")
    print(f"newest checkpoint: {d['newest_checkpoint']}  (a model checkpoint: give it to vt info, vt sample, "
          "vt eval --ckpt, vt convert orbax-to-hf)")


PIPELINE_MANIFEST = "manifest.json"  # vt.recipe.stages.MANIFEST (not imported: that module imports the learners)
PIPELINE_PLAN = "pipeline.json"  # vt.recipe.runner.PLAN_FILE


def is_pipeline_dir(path: Path) -> bool:
    """A `vt pipeline` / `vt demo` work directory: stage directories with manifests, or the run's summary.json."""
    path = Path(path)
    return path.is_dir() and ((path / "summary.json").is_file() and (path / "table.md").is_file()
                              or any((d / PIPELINE_MANIFEST).is_file() for d in path.iterdir() if d.is_dir()))


def describe_pipeline(path: Path) -> dict:
    """A pipeline work directory: its finished stages in the order they finished (time, checkpoint, held-out
    mean), stage directories without a manifest (running, or interrupted: a re-run resumes them), the final
    checkpoint and the Hugging Face export."""
    path = Path(path)
    try:  # the enabled stages, in order, as the runner wrote them when it started (vt.recipe.runner)
        planned = json.loads((path / PIPELINE_PLAN).read_text())["stages"]
    except (OSError, ValueError, KeyError, TypeError):
        planned = []
    stages, unfinished = [], []
    for d in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            m = json.loads((d / PIPELINE_MANIFEST).read_text())
        except FileNotFoundError:
            if d.name in planned and any(d.iterdir()):
                unfinished.append(d.name)
            continue
        except ValueError as e:
            raise VtError(f"{d / PIPELINE_MANIFEST}: not valid JSON ({e})") from None
        heldout = m.get("heldout") or {}
        stages.append({"stage": m.get("stage", d.name), "finished": m.get("finished"), "wall_s": m.get("wall_s"),
                       "checkpoint": str(path / m["checkpoint"]) if m.get("checkpoint") else None,
                       "heldout_mean": sum(heldout.values()) / len(heldout) if heldout else None,
                       "metrics": {k: v for k, v in (m.get("metrics") or {}).items()
                                   if k in ("hf_dir", "tokenizer_match", "greedy_match", "stopped_at_end_of_turn")}})
    stages.sort(key=lambda m: m["finished"] or "")
    final = next((m["checkpoint"] for m in reversed(stages) if m["checkpoint"]), None)
    export = next((m["metrics"] for m in stages if m["stage"] == "export"), None)
    if export and Path(export.get("hf_dir", "")).resolve().is_relative_to(path.resolve()):  # as `path` was given
        export["hf_dir"] = str(path / Path(export["hf_dir"]).resolve().relative_to(path.resolve()))
    unfinished.sort(key=lambda s: planned.index(s))
    return {"path": str(path), "format": "vt-pipeline", "stages": stages, "unfinished": unfinished,
            "final_checkpoint": final, "hf_export": export.get("hf_dir") if export else None,
            "hf_check": {k: v for k, v in export.items() if k != "hf_dir"} if export else None}


def _print_pipeline(d: dict) -> None:
    print(f"{d['path']}  [pipeline work directory, {len(d['stages'])} finished stage(s)]")
    for m in d["stages"]:
        mean = f"held-out mean {m['heldout_mean']:.3f}" if m["heldout_mean"] is not None else ""
        print(f"  {m['stage']:13s} {m['wall_s'] or 0:7.0f} s  {mean:20s} {m['checkpoint'] or ''}")
    for s in d["unfinished"]:
        print(f"  {s:13s} not finished (running, or interrupted: a re-run resumes it)")
    print(f"final checkpoint: {d['final_checkpoint'] or 'none yet'}" +
          ("  (give it to vt info, vt sample, vt eval --ckpt, vt convert orbax-to-hf)" if d["final_checkpoint"] else ""))
    if d["hf_export"]:
        checks = ", ".join(f"{k} {v}" for k, v in (d["hf_check"] or {}).items())
        print(f"Hugging Face export: {d['hf_export']}" + (f"  ({checks})" if checks else ""))


def _info(args: argparse.Namespace) -> int:
    from vt.checkpoint.workdir import is_run_dir
    if not args.path.exists():
        raise VtError(f"{args.path}: no such file or directory")
    if is_pipeline_dir(args.path) and not (args.path / "model_config.json").is_file():
        d = describe_pipeline(args.path)
        print(json.dumps(d, indent=2)) if args.json else _print_pipeline(d)
        return 0
    if args.path.is_dir() and is_run_dir(args.path):  # its config.json is the run's, not a model's
        d = describe_run(args.path)
        if args.json:
            print(json.dumps(d, indent=2))
        else:
            _print_run(d)
        return 0
    d = describe(args.path)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"{d['path']}  [{d['format']}]  preset: {d['preset'] or 'custom'}")
    print(f"parameters: {d['param_count']:,}   dtypes: {', '.join(d['dtypes'])}")
    for k, v in d["config"].items():
        print(f"  {k:26s} {v}")
    print(f"tensors ({len(d['tensors'])}):")
    for k, t in d["tensors"].items():
        print(f"  {k:56s} {t['dtype']:9s} {tuple(t['shape'])}")
    return 0
