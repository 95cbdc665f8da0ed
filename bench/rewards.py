"""Reward throughput on this machine: math and code verifications per second, side by side with peers.

    python bench/rewards.py [--workers 2] [--math-items 300] [--code-problems 40]

Math: vt's MathReward (math-verify in killable worker processes, hard deadline per item) vs. calling
math-verify in-process (no isolation, no deadline: what a naive trainer would do).
Code: vt's CodeReward (one bubblewrap sandbox per test, rlimits, capped output) vs. a bare
``subprocess.run(python3 solution.py)`` per test (no isolation). Printed ratios are vt rate / peer rate (< 1: vt is slower).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--math-items", type=int, default=300)
    ap.add_argument("--code-problems", type=int, default=40)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; workers={args.workers}")
    vt_m, peer_m = bench_math(args.math_items, args.workers)
    print(f"math  vt MathReward          {vt_m:8.1f} verifications/s")
    print(f"math  math-verify in-process {peer_m:8.1f} verifications/s   (vt/peer = {vt_m / peer_m:.2f}x)")
    vt_c, peer_c = bench_code(args.code_problems, args.workers)
    print(f"code  vt CodeReward (bwrap)  {vt_c:8.1f} problems/s  ({3 * vt_c:.1f} test runs/s)")
    print(f"code  bare subprocess        {peer_c:8.1f} problems/s  (vt/peer = {vt_c / peer_c:.2f}x)")


if __name__ == "__main__":
    main()
