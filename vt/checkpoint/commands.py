"""`vt convert` and `vt info`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from vt import VtError
from vt.checkpoint.seal import add_trust_flag, verify_seal
from vt.validation import positive_float


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert checkpoints between Hugging Face and Orbax format")
    sub = p.add_subparsers(dest="direction", required=True)
    h2o = sub.add_parser("hf-to-orbax", help="HF_DIR (config.json + safetensors) -> vt checkpoint")
    h2o.add_argument("hf_dir", type=Path)
    h2o.add_argument("ckpt_dir", type=Path)
    h2o.add_argument("--param-dtype", choices=["float32", "bfloat16"], default=None,
                     help="dtype to store parameters in (default float32)")
    add_trust_flag(h2o)
    h2o.set_defaults(func=_hf_to_orbax)
    o2h = sub.add_parser("orbax-to-hf", help="vt checkpoint -> HF directory loadable by transformers")
    o2h.add_argument("ckpt_dir", type=Path)
    o2h.add_argument("hf_dir", type=Path)
    o2h.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                     help="safetensors dtype (default: the checkpoint's param_dtype, so nothing is lost)")
    o2h.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory whose files to copy")
    o2h.add_argument("--max-shard-gb", type=positive_float, default=2.0)
    o2h.add_argument("--lora-format", choices=["merged", "peft"], default="merged",
                     help="a LoRA checkpoint: merged = the adapters folded into the weights (a plain model, the "
                          "default); peft = a PEFT adapter directory, with the frozen base model in base_model/")
    add_trust_flag(o2h)
    o2h.set_defaults(func=_orbax_to_hf)

    info = subparsers.add_parser("info", help="describe a vt checkpoint, HF model directory or training workdir")
    info.add_argument("path", type=Path)
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_trust_flag(info)
    info.set_defaults(func=_info)


def _hf_to_orbax(args: argparse.Namespace) -> int:
    from vt.checkpoint.params import import_from_hf
    from vt.model.config import param_count
    cfg = import_from_hf(args.hf_dir, args.ckpt_dir, param_dtype=args.param_dtype)
    print(f"wrote {args.ckpt_dir} ({param_count(cfg):,} parameters, {cfg.param_dtype})")
    return 0


def _orbax_to_hf(args: argparse.Namespace) -> int:
    from vt.checkpoint.params import export_peft, export_to_hf, load_model
    model = load_model(args.ckpt_dir)
    export = export_peft if args.lora_format == "peft" else export_to_hf
    export(model, args.hf_dir, dtype=args.dtype, tokenizer_dir=args.tokenizer,
                 max_shard_bytes=int(args.max_shard_gb * (1 << 30)))
    print(f"wrote {args.hf_dir} ({args.dtype or model.cfg.param_dtype})")
    return 0


def describe(path: Path) -> dict:
    """Config, parameter count, and per-tensor shapes/dtypes, read from metadata only (no weights loaded), after
    verifying the checkpoint's seal (a Hugging Face directory from elsewhere has none and is described as is)."""
    from vt.checkpoint.manager import architecture
    from vt.model.config import PRESETS, param_count
    path = Path(path)
    if (path / "config.json").is_file() and not (path / "model_config.json").is_file():
        verify_seal(path, f"Hugging Face directory {path}", required=False)
        from vt.checkpoint.hf import SafetensorsReader, read_hf_config
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
    from vt.checkpoint.manager import CHECKPOINTS_DIR
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


def _info(args: argparse.Namespace) -> int:
    from vt.checkpoint.manager import is_run_dir
    if not args.path.exists():
        raise VtError(f"{args.path}: no such file or directory")
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
