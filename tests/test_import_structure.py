"""vt's import graph has no cycles: not between its files, and not between its packages. Commands that use no
device import no JAX (run as `vt` runs them, in a fresh process).

Read from the source (ast), so every import counts, deferred ones inside functions too: a cycle hidden behind a
function-level import is still two modules that cannot be understood (or tested) apart. Library modules import
at the top; deferred imports are allowed only in `commands.py` files, `vt/cli.py` and for optional extras.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vt"
# Modules a library module may import inside a function, each with its reason. Everything else goes at the top.
DEFERRED_OK = {
    "torch": "optional extra (parity tests, HF export checks)",
    "transformers": "optional extra",
    "safetensors.torch": "optional extra",
    "matplotlib": "optional extra (plots)",
    "tensorboardX": "optional extra (metrics)",
    "wandb": "optional extra (W&B logging, vt.tracking)",
    "tensorflow_datasets": "optional extra (TFDS sources)",
    "grain.sources": "ArrayRecord files only; grain takes over a second to import",
    "array_record": "ArrayRecord files only",
    "datasketch": "near-duplicate removal only, when configured",
    "nltk": "IFEval sentence/word constraints only; import nltk pulls in scipy (seconds)",
    "punkt": "the Punkt tables nltk uses, same reason",
    "langdetect": "IFEval language constraint only",
    "jax.experimental.pallas.ops.tpu": "TPU-only kernel",
    "jax.experimental.pallas.ops.gpu": "opt-in GPU kernel; importing it warns (deprecated upstream)",
    "vt.model.splash": "TPU-only kernel (imports Pallas TPU)",
    "libtpu": "optional extra (vt plan: TPU topologies compiled from any host)",
}
# Scripts run in their own (sandboxed) process, where what is imported and when is part of the isolation.
WORKER_SCRIPTS = {"vt.rewards.sandbox.inside.harness", "vt.rewards._math_worker", "vt.rewards.sandbox.inside.pool_server"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The vt module a dotted import name refers to (the longest known prefix), or None if not vt's."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> list[tuple[str, int, bool]]:
    """(imported vt module, line, deferred) for every import statement of `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    deferred_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = module.split(".") if is_pkg else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule; `from pkg import name` imports pkg (its __init__).
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            target = resolve(name)
            if target and target != module:
                out.append((target, node.lineno, id(node) in deferred_nodes))
    return out


GRAPH = {m: sorted({t for t, _, _ in imports_of(m)}) for m in MODULES}


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the directed graph as a path [a, b, ..., a], or None (iterative DFS, white/grey/black)."""
    state: dict[str, int] = {}
    for start in graph:
        if state.get(start):
            continue
        stack = [(start, iter(graph[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                stack.append((child, iter(graph.get(child, []))))
                path.append(child)
    return None


def package_of(module: str) -> str:
    """vt.train.step -> vt.train; a module at the package root (vt.config) is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_finder_sees_a_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_no_cycle_between_files():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle between vt's files: " + " -> ".join(cycle)


def test_no_cycle_between_packages():
    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        src = package_of(module)
        packages.setdefault(src, set())
        for t in targets:
            # vt/__init__.py (the root: VtError) is imported by everything and imports nothing of vt's packages.
            if package_of(t) != src and t != "vt":
                packages[src].add(package_of(t))
    cycle = find_cycle({k: sorted(v) for k, v in packages.items()})
    assert cycle is None, "import cycle between vt's packages: " + " -> ".join(cycle)


def _deferred_allowed(module: str) -> bool:
    return module.endswith(".commands") or module in ("vt.cli", "vt.__main__") or module in WORKER_SCRIPTS


@pytest.mark.parametrize("module", sorted(MODULES))
def test_library_modules_import_at_the_top(module):
    if _deferred_allowed(module):
        return
    tree = ast.parse(MODULES[module].read_text())
    deferred = []
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                if isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom):
                    names = [n.module or ""]
                else:
                    continue
                if not all(any(x == e or x.startswith(e + ".") for e in DEFERRED_OK) for x in names):
                    deferred.append(f"{MODULES[module].relative_to(ROOT)}:{n.lineno} {', '.join(names)}")
    assert not deferred, "deferred imports of non-optional modules (import them at the top):\n" + "\n".join(deferred)


# `vt` commands that use no device, each run for real in a fresh process: none may import JAX (the CLI joins a
# multi-process run only when launched as one: vt.cluster). Each: (arguments, exit status), given a directory.
HOST_COMMANDS = {
    "reward": (lambda d: ["reward", "--domain", "math", "--input", d / "math.jsonl", "--out", d / "out.jsonl",
                          "--no-progress"], 0),
    "data filter": (lambda d: ["data", "filter", d / "data.jsonl", d / "out.jsonl", "--no-progress"], 0),
    "data dedup": (lambda d: ["data", "dedup", d / "data.jsonl", d / "out.jsonl", "--no-progress"], 0),
    # a wheel without the BPE ranks: the command runs until it reads the wheel (no network, no cache)
    "tokenizer": (lambda d: ["tokenizer", "build-qwen2.5", d / "tok", "--wheel", d / "dashscope-2.0.2-py3-none-any.whl"],
                  2),
}


def _imports_of_a_run(args) -> str:
    """`vt ARGS` in a fresh process, as a single-process launch: its exit status and the heavy modules it imported."""
    code = ("import sys; from vt.cli import main; rc = main(sys.argv[1:]); "
            "heavy = [m for m in ('jax', 'flax', 'torch') if m in sys.modules]; "
            "print('exit', rc, 'imported', heavy, file=sys.stderr)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROC", "JAX_PROCESS_ID", "SLURM_"))}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env=env).stderr


def test_info_on_a_hugging_face_directory_imports_no_jax(hf_dir):
    assert "exit 0 imported []" in _imports_of_a_run(["info", hf_dir])


@pytest.mark.parametrize("command", sorted(HOST_COMMANDS))
def test_host_commands_import_no_jax(command, tmp_path):
    (tmp_path / "math.jsonl").write_text(json.dumps({"completion": "so \\boxed{4}", "ground_truth": "4"}) + "\n")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"question {i}", "response": "an answer "
                                                                         f"that is long enough {i}"}) + "\n"
                                                 for i in range(3)))
    with zipfile.ZipFile(tmp_path / "dashscope-2.0.2-py3-none-any.whl", "w") as z:
        z.writestr("dashscope/__init__.py", "")
    args, status = HOST_COMMANDS[command]
    err = _imports_of_a_run(args(tmp_path))
    assert f"exit {status} imported []" in err, err[-2000:]
