"""Session fixtures shared by every test folder (the helpers behind them live in testutil.py), and the
`devices(n)` marker: a test that needs n simulated CPU devices runs in a child pytest process started with them
(JAX fixes its device count when it starts, and this process already started it with one)."""
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# One persistent JAX compilation cache for the whole run: the xdist workers, the devices(n) children and every `vt`
# subprocess inherit it, so a program the suite compiled once (the tiny model's train step, say, in each of a
# resume test's runs) is read back instead of compiled again. Set before jax is imported (it reads these at
# import); a cache the user points JAX_COMPILATION_CACHE_DIR at is used instead (and kept). A size bound turns on
# jax's file lock, so concurrent writers never show a reader a half-written entry. The workers and children find
# the variable set, so only the process that made the directory removes it.
_OWN_JAX_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JAX_CACHE = tempfile.mkdtemp(prefix="vt-test-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(32 << 30))
# The suite runs on the CPU. With libtpu installed (the test extra: tests/plan compiles for TPU topologies in
# children of their own), JAX would otherwise probe for a TPU in every worker and `vt` subprocess (1-2 s each on
# a 2-core box) and the first of them would hold libtpu's lockfile.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from testutil import build_once, make_hf_model, run_vt  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def shared_dir(tmp_path_factory) -> Path:
    """A directory shared by this session's xdist workers and its devices(n) child processes (they inherit
    VT_TEST_SHARED_DIR), where session fixtures that cost a subprocess or a torch model are built once."""
    if "VT_TEST_SHARED_DIR" not in os.environ:
        root = tmp_path_factory.getbasetemp()
        root = root.parent if "PYTEST_XDIST_WORKER" in os.environ else root  # the workers' common parent
        (root / "shared").mkdir(exist_ok=True)
        os.environ["VT_TEST_SHARED_DIR"] = str(root / "shared")
    return Path(os.environ["VT_TEST_SHARED_DIR"])


@pytest.fixture(scope="session", params=[("qwen2", True), ("qwen2", False), ("qwen3", True), ("qwen3", False)],
                ids=["qwen2-tied", "qwen2-untied", "qwen3-tied", "qwen3-untied"])
def hf_dir(request, shared_dir) -> Path:
    """An HF directory (save_pretrained) of a tiny random Qwen2 and Qwen3 (testutil.make_hf_model), tied and
    untied."""
    return _hf_dir(*request.param)


def _hf_dir(arch: str, tie: bool) -> Path:  # after the shared_dir fixture (VT_TEST_SHARED_DIR)
    return build_once(f"hf_{arch}_{tie}", lambda d: make_hf_model(tie=tie, arch=arch).save_pretrained(d))


def _vt_ckpt(hf_dir: Path) -> Path:
    """`hf_dir` converted with the real CLI."""
    return build_once(f"ckpt_{hf_dir.name}",
                      lambda d: run_vt("convert", "hf-to-orbax", str(hf_dir), str(d / "ck"), check=True)) / "ck"


@pytest.fixture(scope="session")
def vt_ckpt(hf_dir, shared_dir) -> Path:
    return _vt_ckpt(hf_dir)


@pytest.fixture(scope="session")
def hf_dir_qwen2(shared_dir) -> Path:
    """One of `hf_dir`'s models (Qwen2, tied), for tests whose subject is not the architecture (error paths)."""
    return _hf_dir("qwen2", True)


@pytest.fixture(scope="session")
def vt_ckpt_qwen2(hf_dir_qwen2, shared_dir) -> Path:
    return _vt_ckpt(hf_dir_qwen2)


# Property tests draw the same examples on every run of the suite (CI must not turn red by luck); pass
# `--hypothesis-profile=explore` to search with fresh random examples, and pin what it finds with @example.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None)
_hypothesis_settings.register_profile("explore", max_examples=500)
_hypothesis_settings.load_profile("ci")


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def pytest_unconfigure(config):
    if _OWN_JAX_CACHE:
        shutil.rmtree(_OWN_JAX_CACHE, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "devices(n, timeout=900): runs in a child pytest process with n simulated CPU "
                                       "devices (XLA_FLAGS); the test's fixtures are set up there")


def _device_count_flag() -> int | None:
    m = re.search(DEVICE_COUNT_FLAG + r"=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(m.group(1)) if m else None


def pytest_collection_modifyitems(config, items):
    if "PYTEST_XDIST_WORKER" in os.environ:  # every worker orders alike (xdist checks): see _WorkUnitsCostliestFirst
        items.sort(key=_work_unit_order(items))
    for item in items:
        marker = item.get_closest_marker("devices")
        if marker is None or _device_count_flag() == marker.args[0]:
            continue  # not marked, or this is the child: the test runs here
        item.fixturenames = ["shared_dir"]  # the rest are set up in the child
        item.runtest = functools.partial(_run_in_child, item, marker.args[0], marker.kwargs.get("timeout", 900))


def _run_in_child(item, devices: int, timeout: int) -> None:
    flags = re.sub(DEVICE_COUNT_FLAG + r"=\d+", "", os.environ.get("XLA_FLAGS", ""))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    env |= {"XLA_FLAGS": f"{flags} {DEVICE_COUNT_FLAG}={devices}".strip(), "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "--no-header", "-p", "no:xdist", item.nodeid]
    proc = subprocess.run(cmd, cwd=item.config.rootpath, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{item.nodeid} on {devices} simulated devices (child pytest, exit {proc.returncode}):\n"
                    f"{proc.stdout[-20000:]}\n{proc.stderr[-5000:]}", pytrace=False)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    # Not a skip of our own: a test that skips itself in the child (its own pytest.skip or skipif, e.g. a missing
    # optional dependency) must read as skipped here too, not as passed.
    if "skipped" in summary and "passed" not in summary:
        pytest.skip(f"skipped in the child on {devices} devices: {proc.stdout[-2000:]}")
    print(proc.stdout[-5000:])


# Scheduling under xdist (`make test`'s -n 2). xdist's default hands each worker runs of consecutive tests: the costly
# files, late in the alphabet (recipe/, rl/, scale/), ended on one worker while the other idled, and two workers
# could ask for one expensive build_once fixture at once, one of them waiting on the lock. Instead a work unit is a
# test file, or the files that share one such fixture (one worker builds it and runs them all); units go to the
# worker that is almost out of work, the costliest first by durations.json (seconds per file, from a run of the
# suite: `pytest -n 2 tests --record-durations tests/durations.json` refreshes it; a file it lacks counts as an
# average one). The order only decides where and when a test runs, never whether.
DURATIONS = Path(__file__).parent / "durations.json"
SHARED_FIXTURE_UNITS = {
    "tests/recipe/test_pipeline.py": "demo_ci", "tests/recipe/test_opd_learning.py": "demo_ci",
    **{f"tests/{f}.py": "tool_demo_sft1" for f in ("recipe/test_tool_demo", "rl/test_tool_learning",
                                                    "rl/test_tool_parity", "rl/test_tool_async_resume")},
}


def _work_unit(nodeid: str) -> str:
    file = nodeid.split("::")[0]
    return SHARED_FIXTURE_UNITS.get(file, file)


def _work_unit_order(items):
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    average = sum(seconds.values()) / len(seconds) if seconds else 0.0
    first, cost = {}, {}
    for i, item in enumerate(items):
        first.setdefault(_work_unit(item.nodeid), i)
    for file in {item.nodeid.split("::")[0] for item in items}:
        cost[_work_unit(file)] = cost.get(_work_unit(file), 0.0) + seconds.get(file, average)
    # costliest unit first; within a unit, the collection order (the sort is stable: module fixtures set up once)
    return lambda item: (-cost[_work_unit(item.nodeid)], first[_work_unit(item.nodeid)])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "load":  # an explicit --dist keeps xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _WorkUnitsCostliestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the workers' order (costliest first), not xdist's by test count
    return _WorkUnitsCostliestFirst(config, log)


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="FILE", default=None,
                     help="write this run's seconds per test file (setup, call and teardown) to FILE as JSON")


_seconds_per_file: dict[str, float] = {}


def pytest_runtest_logreport(report):
    file = report.nodeid.split("::")[0]
    _seconds_per_file[file] = _seconds_per_file.get(file, 0.0) + report.duration


def pytest_sessionfinish(session):
    out = session.config.getoption("--record-durations")
    if out and not hasattr(session.config, "workerinput"):  # the xdist controller, or a run without xdist
        ranked = sorted(_seconds_per_file.items(), key=lambda kv: -kv[1])
        Path(out).write_text(json.dumps({f: round(s, 1) for f, s in ranked}, indent=0) + "\n")
