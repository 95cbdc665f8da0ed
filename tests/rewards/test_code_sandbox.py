"""Attacks on the code sandbox: each must score 0 and leave the host untouched.

They run against the default CodeReward, i.e. the warm sandbox pool (vt/rewards/sandbox/warm.py); attacks aimed at
the pool itself (state left for the next run, a run against its own server) are in test_code_pool.py.

Most attacks come with a *control*: the same program graded against the output it prints when the
attack fails must score 1, proving the program really ran and the attack really was blocked (rather
than the program crashing for an unrelated reason).

The attacks run for both kinds of test (``kind``): a stdin/stdout test, and a program test (Python test
code, as HumanEval's and MBPP's) that calls a function of the solution which runs the attack and
returns what it printed.
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import vt
from vt.rewards.base import RewardSpecError
from vt.rewards.sandbox import cold as sandbox_mod
from vt.rewards.code.grading import json_equal, normalise_stdout
from vt.rewards.code.reward import CodeReward, last_code_block

from .conftest import Sampler, processes_matching, rss_bytes

TEST_LIMIT_S = 2.0
CAP = 4 << 20


@pytest.fixture(scope="module")
def reward():
    with CodeReward(workers=2, test_time_limit_s=TEST_LIMIT_S, output_bytes=CAP, problem_time_limit_s=20) as r:
        assert r.pool is not None  # these attacks are run against the warm pool
        yield r


def leftovers(reward) -> list[int]:
    """Live processes of the sandbox uids besides the pool's idle workers (outer bwrap, namespace init,
    server and the rest of test_code_pool's list: they run no candidate code): whatever a run left behind.
    Listed before the pool's, so that an init still exiting in between is in the pool's only."""
    live = processes_matching(reward.sandbox_uids)
    idle = reward.pool.pids() if reward.pool is not None else set()
    return [p for p in live if p not in idle]


def block(src: str) -> str:
    return "<think>let me write it</think>\n```python\n" + textwrap.dedent(src).strip() + "\n```\n"


def stdio(output: str, inp: str = "") -> dict:
    return {"tests": [{"input": inp, "output": output}]}


KINDS = ["stdio", "program"]


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def program_block(src: str) -> str:
    """A solution whose function ``answer()`` runs ``src`` as a script and returns what it printed."""
    body = textwrap.dedent(src).strip()
    return block(
        "import contextlib, io\n"
        f"SRC = {body!r}\n"
        "def answer():\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        exec(compile(SRC, 'attack', 'exec'), {'__name__': '__main__'})\n"
        "    return buf.getvalue()\n"
    )


def program_test(output: str) -> dict:
    check = "got = [line.rstrip() for line in answer().rstrip().split('\\n')]\n"
    check += f"assert got == {[line.rstrip() for line in output.rstrip().split(chr(10))]!r}\n"
    return {"tests": [{"program": check}]}


def grade(reward, src: str, output: str, inp: str = "", kind: str = "stdio"):
    if kind == "program":
        return reward([program_test(output)], [program_block(src)])[0]
    return reward([stdio(output, inp)], [block(src)])[0]


def assert_blocked(reward, src: str, leaked: str, blocked: str = "blocked", kinds=("wrong",), kind: str = "stdio"):
    """The attack's success output scores 0, its failure output scores 1 (the program did run)."""
    attack = grade(reward, src, leaked, kind=kind)
    assert attack.score == 0.0 and attack.failure in kinds, attack
    control = grade(reward, src, blocked, kind=kind)
    assert control.score == 1.0, control


# ---- extraction and comparison -------------------------------------------------------------------


def test_last_code_block_and_language():
    text = "```python\nprint(1)\n```\ntext\n```py\nprint(2)\n```"
    assert last_code_block(text) == ("py", "print(2)\n")
    assert last_code_block("no code") is None
    assert last_code_block("```python\nunterminated") is None


def test_normalise_stdout_strips_trailing_whitespace_only():
    assert normalise_stdout("1 2  \n3\t\n\n\n") == ["1 2", "3"]
    assert normalise_stdout(" 1\n") == [" 1"]  # leading whitespace is significant
    assert normalise_stdout("a\r\nb") == ["a", "b"]


def test_json_equal_is_strict_about_types():
    assert json_equal([1, 2], [1, 2]) and json_equal(0.1 + 0.2, 0.3) and json_equal(2, 2.0)
    assert not json_equal(1, True) and not json_equal([1], [1, 2]) and not json_equal("1", 1)
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})


# ---- correct programs pass ---------------------------------------------------------------------


def test_stdin_and_call_based_pass(reward):
    stdin_prog = block("a, b = map(int, input().split())\nprint(a + b)")
    method = block("class Solution:\n    def add(self, a, b):\n        return [a + b, {'k': None}]")
    top_level = block("def add(a, b):\n    return [a + b, {'k': None}]")
    calls = {"tests": [{"fn_name": "add", "args": [1, 2], "expected": [3, {"k": None}]}]}
    two = {"tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7", "output": "12   \n\n"}]}
    res = reward([two, calls, calls], [stdin_prog, method, top_level])
    assert [r.score for r in res] == [1.0, 1.0, 1.0], res
    assert res[0].details["tests_passed"] == 2


def test_all_tests_must_pass(reward):
    rec = {"tests": [{"input": "1 2", "output": "3"}, {"input": "2 2", "output": "5"}]}
    r = reward([rec], [block("a, b = map(int, input().split())\nprint(a + b)")])[0]
    assert r.score == 0.0 and r.failure == "wrong" and r.details["tests_passed"] == 1


def test_correct_program_printing_one_megabyte_passes(reward):
    r = grade(reward, "print('x' * 1_000_000)", "x" * 1_000_000)
    assert r.score == 1.0, r


def test_missing_code_block_and_other_language_are_format_failures(reward):
    rec = stdio("1")
    r1, r2 = reward([rec, rec], ["print(1)", "```cpp\nint main(){}\n```"])
    assert r1.failure == "format" and r2.failure == "format" and r1.score == r2.score == 0.0


def test_test_case_without_expected_output_is_a_dataset_error(reward):
    with pytest.raises(RewardSpecError, match=r"record 0: field 'tests'\[0\].*output"):
        reward([{"tests": [{"input": "1"}]}], [block("print(1)")])
    with pytest.raises(RewardSpecError, match=r"tests'\[1\].*expected"):
        reward([{"tests": [{"fn_name": "f", "args": [], "expected": 1}, {"fn_name": "f", "args": []}]}], [block("")])
    with pytest.raises(RewardSpecError, match="record 0: no tests: expected 'tests'"):
        reward([{}], [block("")])
    with pytest.raises(RewardSpecError, match="non-empty"):
        reward([{"tests": []}], [block("")])


# ---- attacks -------------------------------------------------------------------------------------


def test_no_network_even_to_host_loopback(reward, kind):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    src = f"""
        import socket
        try:
            s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
            s.sendall(b"hello")
            print("connected")
        except OSError:
            print("blocked")
    """
    try:
        assert_blocked(reward, src, "connected", kind=kind)
        with pytest.raises(socket.timeout):
            server.accept()  # the server never saw a connection
    finally:
        server.close()


KEYRINGS = """
    import ctypes, mmap, platform
    libc = ctypes.CDLL(None, use_errno=True)
    ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
    def call(nr, *args):  # -errno, as the i386 call below returns it
        r = libc.syscall(nr, *args)
        return -ctypes.get_errno() if r == -1 else r
    got = [call(ADD_KEY, b"user", b"left", b"for the next run", 16, ring) for ring in (-4, -5)]
    got.append(call(KEYCTL, 0, -4, 1))  # KEYCTL_GET_KEYRING_ID of the uid's keyring
    if platform.machine() == "x86_64":
        got.append(call(0x40000000 | KEYCTL, 0, -4, 1))  # the x32 ABI's number (ENOSYS where x32 is off)
        # the same keyctl through the i386 ABI: int 0x80, eax = 288
        code = bytes([0x53, 0xB8, 0x20, 0x01, 0, 0, 0x31, 0xDB, 0xB9, 0xFC, 0xFF, 0xFF, 0xFF,
                      0xBA, 1, 0, 0, 0, 0xCD, 0x80, 0x5B, 0xC3])  # push rbx .. int 0x80; pop rbx; ret
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        got.append(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
    print("blocked" if all(r == -1 for r in got) else "reached %s" % got)  # -1: -EPERM, the filter's answer
"""


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "cold"])
def test_kernel_keyrings_are_refused_on_every_abi(reward, pool, kind):
    """A uid's keyrings live as long as its user namespace, not its processes: in a warm sandbox they
    would carry data from one sample's run to the next. The seccomp filter refuses the calls, through the
    i386 ABI too (a filter on the native numbers alone would let int 0x80 by)."""
    if pool:
        assert_blocked(reward, KEYRINGS, "reached", kind=kind)
        return
    with CodeReward(workers=1, pool=False, test_time_limit_s=TEST_LIMIT_S) as cold:
        assert_blocked(cold, KEYRINGS, "reached", kind=kind)


def test_environment_secrets_are_not_visible(reward, monkeypatch, kind):
    secret = "vt-fake-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("VT_FAKE_SECRET", secret)
    src = f"""
        import os, glob
        seen = repr(dict(os.environ))
        for p in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
            try:
                seen += open(p, "rb").read().decode(errors="replace")
            except OSError:
                pass
        print("leaked" if {secret!r} in seen else "blocked")
    """
    assert_blocked(reward, src, "leaked", kind=kind)
    r = grade(reward, "import os; print(dict(os.environ))", secret, kind=kind)
    assert r.score == 0.0 and secret not in repr(r.details)


def test_host_files_cannot_be_read_or_written(reward, tmp_path, kind):
    canary_text = "canary-" + secrets.token_hex(8)
    repo = Path(vt.__file__).resolve().parents[1]
    # The user's home, the checkout (where the user may write it: not as test_unprivileged's uid) and a
    # scratch directory of the test's.
    targets = [d / f".vt_canary_{secrets.token_hex(4)}" for d in (Path.home(), repo, tmp_path) if os.access(d, os.W_OK)]
    assert len(targets) >= 2, targets
    for t in targets:
        t.write_text(canary_text)
    new_files = [t.with_name(t.name + "_new") for t in targets]
    src = f"""
        got = []
        for p in {[str(t) for t in targets]!r}:
            try:
                got.append(open(p).read())
            except OSError:
                pass
            try:
                open(p, "w").write("overwritten")
            except OSError:
                pass
        for p in {[str(t) for t in new_files]!r}:
            try:
                open(p, "w").write("created")
            except OSError:
                pass
        print(got[0] if got else "blocked")
    """
    try:
        assert_blocked(reward, src, canary_text, kind=kind)
        assert all(t.read_text() == canary_text for t in targets)
        assert not any(t.exists() for t in new_files)
    finally:
        for t in targets + new_files:
            t.unlink(missing_ok=True)


def test_files_outside_the_temp_dir_cannot_be_deleted(reward, tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    json_dir = Path(os.__file__).parent / "json"  # the system python's stdlib is bound read-only
    src = f"""
        import os, shutil, glob
        ok = 0
        for p in [{str(victim)!r}, "/code/solution.py", "/code/_harness.py"] + glob.glob("/usr/lib/python3*/json/*.py"):
            try:
                os.remove(p); ok += 1
            except OSError:
                pass
        for d in ["/usr/lib", "/etc", "/bin"]:
            try:
                shutil.rmtree(d); ok += 1
            except OSError:
                pass
        open("/tmp/mine.txt", "w").write("x")  # the sandbox's own temp dir is writable
        os.remove("/tmp/mine.txt")
        print("deleted" if ok else "blocked")
    """
    assert_blocked(reward, src, "deleted", kind=kind)
    assert victim.read_text() == "keep me"
    assert Path("/usr/lib").is_dir() and Path("/etc/passwd").exists() and json_dir.is_dir()


def test_fork_bomb_is_bounded_and_cleaned_up(reward, kind):
    src = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    uids = reward.sandbox_uids
    if not uids:
        pytest.skip("per-sandbox uids exist only when the grader runs as root (CI does)")
    with Sampler(lambda: len(processes_matching(uids))) as count:
        r = grade(reward, src, "anything", kind=kind)
    assert r.score == 0.0 and r.failure in ("timeout", "runtime_error"), r
    # RLIMIT_NPROC (64: the bomb's uid inside its namespace, its server, the server's parent, its tester and the
    # runs' inits included) plus its outer bwrap and the other worker's standing processes (outer bwrap,
    # namespace init, the server's parent, the server, its tester and inits still exiting): never thousands.
    assert count.peak <= 64 + 9, count.peak
    assert leftovers(reward) == []


@pytest.mark.parametrize("parent", ["exits", "sleeps"])
def test_setsid_daemon_dies_with_the_sandbox(reward, parent, kind):
    marker = f"{1000 + secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"  # unique `sleep` argument
    src = f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{marker}"])
            os._exit(0)
        time.sleep(0.3)
        print("spawned", flush=True)
        {"time.sleep(600)" if parent == "sleeps" else "pass"}
    """
    t0 = time.monotonic()
    r = grade(reward, src, "never", kind=kind)
    returned = time.monotonic()
    assert r.score == 0.0
    assert r.failure == ("timeout" if parent == "sleeps" else "wrong"), r
    # Gone within a second of the run ending (at the deadline for the sleeping parent).
    while processes_matching(needle=marker.encode()) and time.monotonic() - returned < 1.0:
        time.sleep(0.05)
    assert processes_matching(needle=marker.encode()) == []
    assert leftovers(reward) == []
    assert returned - t0 < TEST_LIMIT_S + 2


@pytest.mark.parametrize("src", ["while True:\n    pass", "import time\ntime.sleep(100)"], ids=["busy", "sleep"])
def test_busy_loop_and_sleep_time_out(reward, src, kind):
    t0 = time.monotonic()
    r = grade(reward, src, "x", kind=kind)
    assert r.score == 0.0 and r.failure == "timeout", r
    assert time.monotonic() - t0 < TEST_LIMIT_S + 2


def test_huge_print_hits_output_limit_with_bounded_grader_memory(reward):
    before = rss_bytes()
    with Sampler(rss_bytes) as rss:
        r = grade(reward, "import sys\nsys.stdout.write('x' * 100_000_000)", "x")
    assert r.score == 0.0 and r.failure == "output_limit", r
    assert rss.peak - before < CAP + (48 << 20), (before, rss.peak)


def test_huge_allocation_is_a_memory_failure(reward, kind):
    r = grade(reward, "x = bytearray(8 << 30)\nprint('allocated')", "allocated", kind=kind)
    assert r.score == 0.0 and r.failure == "memory", r


def test_large_file_write_hits_the_file_size_cap(kind):
    with CodeReward(workers=1, test_time_limit_s=5, file_bytes=1 << 20) as r:
        src = "f = open('/tmp/big', 'wb')\nfor _ in range(64):\n    f.write(b'x' * (1 << 16))\nprint('wrote')"
        res = grade(r, src, "wrote", kind=kind)
    assert res.score == 0.0 and res.failure == "output_limit", res


def test_filling_tmp_hits_its_size_cap(kind):
    with CodeReward(workers=1, test_time_limit_s=5, tmp_bytes=1 << 20, file_bytes=1 << 30) as r:
        src = "for i in range(64):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (1 << 16))\nprint('wrote')"
        res = grade(r, src, "wrote", kind=kind)
    assert res.score == 0.0 and res.failure == "output_limit", res


def test_dev_is_read_only_and_dev_shm_is_size_capped(reward):
    # /dev was a writable tmpfs without a size cap: 1 GiB into /dev/shm went straight into host memory.
    # Files of 32 MiB each, under the per-file size limit (RLIMIT_FSIZE), 1 GiB in all.
    for where in ("/dev/shm", "/dev"):
        src = f"""
            try:
                for i in range(32):
                    with open(f'{where}/big{{i}}', 'wb') as f:
                        for _ in range(32):
                            f.write(b'x' * (1 << 20))
                print('wrote 1 GiB')
            except OSError:
                print('blocked')
        """
        assert_blocked(reward, src, "wrote 1 GiB")


def _run_memory_bytes(uids) -> int:
    """Memory of every live process of the sandbox uids, summed as proportional set sizes (Pss): a page
    shared by n processes counts 1/n in each. Every run process is a fork of its warm server, so summed
    RSS would count the server's pages once per process of the run (six times here), not once."""
    total = 0
    for pid in processes_matching(uids):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")), 0)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


FORKED_ALLOCATORS = """
    import os, time
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                block = b'x' * ({mib} << 20)  # touched: resident, not just reserved
                time.sleep(1.0)
                os._exit(0)
            except MemoryError:
                os._exit(3)
        pids.append(pid)
    ok = all(os.waitpid(p, 0)[1] == 0 for p in pids)
    print('all allocated' if ok else 'blocked')
"""


@pytest.mark.parametrize("bound", ["cgroup", "rlimit-fallback"])
def test_forked_children_share_one_memory_budget(bound):
    # The limit was per process: four forked children held 4x the budget of host memory in one run.
    budget = 768 << 20
    with CodeReward(workers=1, test_time_limit_s=10, memory_bytes=budget) as r:
        if not r.sandbox_uids:
            pytest.skip("per-sandbox uids (to measure the run's memory) exist only when the grader runs as root")
        if bound == "cgroup":
            if r.sandbox.cgroups is None:
                pytest.skip("no writable memory cgroup on this host (cgroup v2 delegation or v1 as root)")
        else:
            r.sandbox.cgroups = None  # what a host without usable cgroups gets
        # Each sample is the smaller of two walks over /proc, one right after the other: a walk is not atomic, and a
        # child killed (or a page unshared) after its sibling was read lets one walk count the same memory twice
        # (seen once under load: 846 MiB). The attack holds its memory for a second, so both walks see it.
        with Sampler(lambda: min(_run_memory_bytes(r.sandbox_uids), _run_memory_bytes(r.sandbox_uids)),
                     period_s=0.005) as mem:
            attack = r([stdio("all allocated")], [block(FORKED_ALLOCATORS.format(mib=256))])[0]
        control = r([stdio("all allocated")], [block(FORKED_ALLOCATORS.format(mib=32))])[0]
    assert attack.score == 0.0, attack
    # Slack for the warm server and the two bwrap processes; the attack unbounded holds 4 x 256 MiB plus those.
    assert mem.peak <= budget + (64 << 20), (mem.peak, budget)
    assert control.score == 1.0, control


SPINNERS = """
    import os, signal, time
    n = int(input())
    spinners = []
    for _ in range(50):  # spinning processes on every CPU, each in a session of its own
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.sched_setaffinity(0, range(os.cpu_count()))
            time.sleep(0.3)  # once all are forked
            while True:
                pass
        spinners.append(pid)
    time.sleep(5.4)  # as long as its own time limit allows
    for pid in spinners:  # then it stops them, so that its own answer comes in time
        os.kill(pid, signal.SIGKILL)
    print(2 * n)
"""
WORKER = """
    import time
    time.sleep(0.6)  # the spinners spin
    n = int(input())
    s = 0
    for i in range(16_000_000):  # ~1 s of CPU alone on this project's CI box
        s += i % 7
    print(2 * n)
"""


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "cold"])
def test_a_run_cannot_starve_a_concurrent_run_of_another_sample(pool):
    """Fifty spinning processes, each in a session of its own: the scheduler is fair per session, so they took
    all but ~1/26 of both CPUs from the other sample's run, which timed out (0.25 s of work took 2.9 s beside
    thirty of them). Each sandbox is one CPU group (its cgroup): the other run keeps at least its fair share
    (2/3 of its CPU here), and the attack can only ever slow it for as long as its own time limit."""
    rec = {"tests": [{"input": "21", "output": "42"}]}
    with CodeReward(workers=2, pool=pool, test_time_limit_s=6.0, problem_time_limit_s=20) as r:
        if r.sandbox.cgroups is None or not r.sandbox.cgroups.cpu_grouped:
            pytest.skip("no writable cgroup with the cpu controller on this host (cgroup v2 delegation or v1 as root)")
        attack, other = r([rec, rec], [block(SPINNERS), block(WORKER)])
    assert attack.score == 1.0, attack  # the attack ran to its end
    assert other.score == 1.0, other


def test_cgroups_left_by_dead_processes_are_removed_and_no_other(tmp_path):
    """A trainer killed with SIGKILL leaves its sandboxes' cgroups (each holds kernel memory): the next
    reward built on the host removes them, if their maker is dead and they are older than STALE_AFTER_S,
    never one that holds a process (rmdir refuses it) or a live process's."""
    cgroups = sandbox_mod.sandbox_cgroups()
    if cgroups.base is None:
        pytest.skip("no writable cgroup on this host (cgroup v2 delegation or v1 as root)")
    gone = subprocess.Popen(["true"])
    gone.wait()
    old = time.time() - 2 * sandbox_mod.STALE_AFTER_S
    sleeper = subprocess.Popen(["sleep", "30"])
    made = {}
    try:
        for base in [b for b in (cgroups.base, cgroups.cpu_base) if b is not None]:
            for name, age, stays in ((f"vt-sandbox-{gone.pid}-1", old, False),
                                     (f"vt-sandbox-probe-{gone.pid}", old, False),
                                     (f"vt-sandbox-{gone.pid}-2", None, True),  # too young: maybe being joined
                                     # its maker lives (a number this process's own sandboxes, counted from
                                     # 1, do not reach: -3 met a live one when other tests ran here first)
                                     (f"vt-sandbox-{os.getpid()}-{10**9}", old, True),
                                     (f"vt-sandbox-{gone.pid}-4", old, True)):  # holds a process
                path = base / name
                path.mkdir()
                if name.endswith("-4"):
                    (path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
                if age is not None:
                    os.utime(path, (age, age))
                made[path] = stays
        sandbox_mod.SandboxCgroups()
        assert {p.name: p.exists() for p in made} == {p.name: stays for p, stays in made.items()}
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in made:
            if path.exists():
                _rmdir_when_empty(path)


def _rmdir_when_empty(path):
    end = time.monotonic() + 5
    while path.exists() and time.monotonic() < end:
        try:
            path.rmdir()
        except OSError:
            time.sleep(0.01)


CALL = {"tests": [{"fn_name": "solve", "args": [3], "expected": 9}, {"fn_name": "solve", "args": [4], "expected": 16}]}
PROGRAM = {"tests": [{"program": "assert solve(3) == 9\nassert solve(4) == 16\n"}]}
SOLVER = block("def solve(x):\n    return x * x")


@pytest.mark.parametrize(
    "src",
    [
        "import sys\nsys.exit(0)\ndef solve(x):\n    return x * x",
        "import os\nos._exit(0)\ndef solve(x):\n    return x * x",
        "import os\ndef solve(x):\n    os._exit(0)",
        "import sys\ndef solve(x):\n    sys.exit(0)",
        "import atexit, os\natexit.register(lambda: print('PASSED'))\ndef solve(x):\n    raise SystemExit(0)",
    ],
    ids=["sys.exit-top", "os._exit-top", "os._exit-in-call", "sys.exit-in-call", "atexit-PASSED"],
)
@pytest.mark.parametrize("record", [CALL, PROGRAM], ids=["call", "program"])
def test_exiting_before_the_result_fails(reward, src, record):
    assert reward([record], [SOLVER])[0].score == 1.0  # control
    r = reward([record], [block(src)])[0]
    assert r.score == 0.0 and r.failure == "runtime_error", r


def test_exit_before_printing_fails_stdin_tests(reward):
    for src in ["import sys\nsys.exit(0)\nprint(3)", "import os\nos._exit(0)"]:
        r = grade(reward, src, "3")
        assert r.score == 0.0 and r.failure == "wrong", r


@pytest.mark.parametrize(
    "src",
    [
        # an object equal to everything: not JSON, rejected in the sandbox, never compared
        "class Any:\n    def __eq__(self, o):\n        return True\n    __ne__ = lambda s, o: False\n"
        "    __hash__ = object.__hash__\ndef solve(x):\n    return Any()",
        # an int that claims equality with everything serialises as its real value
        "class Int(int):\n    def __eq__(self, o):\n        return True\ndef solve(x):\n    return Int(0)",
        # monkey-patching builtins and json: the host never trusts the sandbox's comparison
        "import builtins, json\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0\n"
        "json.dumps = lambda *a, **k: '{\"ok\": \"PASSED\"}'\ndef solve(x):\n    return 'PASSED'",
        # printing what looks like a pass, with a guessed marker
        "def solve(x):\n    print('PASSED')\n    print('\\n0000 {\"ok\": 9}')\n    return None",
    ],
    ids=["eq-always-true", "int-subclass-eq", "patched-builtins", "printed-PASSED"],
)
@pytest.mark.parametrize("record", [CALL, PROGRAM], ids=["call", "program"])
def test_faked_equality_and_printed_passes_fail(reward, src, record):
    r = reward([record], [block(src)])[0]
    assert r.score == 0.0 and r.failure in ("wrong", "runtime_error"), r


def test_printing_PASSED_fails(reward, kind):
    r = grade(reward, "print('PASSED')\nprint('All tests passed')", "42", kind=kind)
    assert r.score == 0.0 and r.failure == "wrong"


@pytest.mark.parametrize(
    "src",
    [
        # the test's assert and comparison live in another process: patching them here changes nothing
        "import builtins, operator\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "operator.eq = lambda a, b: True\nbuiltins.abs = lambda x: 0\ndef solve(x):\n    return 0",
        # print a pass verdict with every marker it could guess, straight to fd 1, then leave
        "import os, sys\ndef solve(x):\n    for fd in (1, 2):\n        os.write(fd, b'\\n0' * 32 + b'{\"ok\": true}\\n')\n"
        "    sys.stdout.write('{\"ok\": true}\\n')\n    os._exit(0)",
        # kill the test process before it can fail
        "import os, signal\ndef solve(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return x * x + 1",
    ],
    ids=["patched-assert-and-operators", "printed-verdicts-then-exit", "kill-the-tests"],
)
def test_program_tests_cannot_be_fooled(reward, src):
    r = reward([PROGRAM], [block(src)])[0]
    assert r.score == 0.0 and r.failure in ("wrong", "runtime_error"), r


def test_the_test_process_is_out_of_the_solutions_reach(reward):
    """The test process holds the nonce (its stdin) and the verdict stream (its stdout): the solution's
    process can open none of its fds, nor its memory. The program test passes only if nothing opened."""
    src = """
        import os
        ppid, opened = os.getppid(), []
        for what in [f"fd/{fd}" for fd in range(8)] + ["mem", "environ"]:
            for mode in ("rb", "wb"):
                try:
                    open(f"/proc/{ppid}/{what}", mode)
                    opened.append((what, mode))
                except OSError:
                    pass
        def solve(x):
            return opened
    """
    r = reward([{"tests": [{"program": "assert solve(0) == [], solve(0)"}]}], [block(src)])[0]
    assert r.score == 1.0, r


def test_a_reported_module_name_never_imports_the_solution_into_the_test_process(reward):
    """The solution's process reports its imported modules by name; the test process imports only
    standard-library names, so a module object named "solution" does not run solution code there."""
    src = """
        import types
        solution = types.ModuleType("solution")
        _harness = types.ModuleType("_harness")
        print("PWNED-IF-IMPORTED")
        def solve(x):
            return x * x
    """
    test = "assert 'solution' not in dir() and '_harness' not in dir()\nassert solve(3) == 9\n"
    r = reward([{"tests": [{"program": test}]}], [block(src)])[0]
    assert r.score == 1.0, r


def test_program_test_kinds_of_failure(reward):
    recs = [PROGRAM] * 4
    srcs = ["def solve(x):\n    return x", "def solve(x):\n    raise ValueError('no')", "x = 1", "def solve(x):\n    return object()"]
    res = reward(recs, [block(src) for src in srcs])
    assert [r.failure for r in res] == ["wrong", "runtime_error", "runtime_error", "runtime_error"], res
    assert "NameError" in res[2].details["reason"] and "plain values" in res[3].details["reason"]


def test_problem_time_budget_stops_remaining_tests():
    tests = [{"input": "", "output": "x"}] * 5
    with CodeReward(workers=1, test_time_limit_s=1.0, problem_time_limit_s=1.5) as r:
        t0 = time.monotonic()
        res = r([{"tests": tests}], [block("import time\ntime.sleep(0.6)\nprint('x')")])[0]
    assert res.score == 0.0 and res.failure == "timeout" and res.details["tests_passed"] < 5, res
    assert time.monotonic() - t0 < 4


def test_concurrent_batch_keeps_order(reward):
    recs = [stdio(str(i * i), str(i)) for i in range(6)]
    comps = [block("n = int(input())\nprint(n * n)") if i % 2 == 0 else block("print(-1)") for i in range(6)]
    assert [r.score for r in reward(recs, comps)] == [1.0, 0.0] * 3


def test_refuses_to_run_without_isolation_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: None)
    with pytest.raises(sandbox_mod.SandboxUnavailable, match="allow_unsandboxed"):
        CodeReward(workers=1)
    with pytest.warns(RuntimeWarning, match="NO SANDBOX"):
        r = CodeReward(workers=1, allow_unsandboxed=True)
    assert not r.sandbox.isolated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = r([stdio("3", "1 2")], [block("a, b = map(int, input().split())\nprint(a + b)")])[0]
    assert res.score == 1.0, res


def test_a_broken_bwrap_counts_as_no_isolation(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    tmp_path.chmod(0o755)
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: str(fake))
    with pytest.raises(sandbox_mod.SandboxUnavailable, match="bwrap test run failed|could not start bwrap"):
        CodeReward(workers=1)
