"""Attacks aimed at the warm sandbox pool (vt/rewards/sandbox/warm.py, inside/pool_server.py).

A worker serves run after run, so a run could try to leave something for the next one, or turn on the
server it was forked from. Each attack goes through CodeReward (the path training takes); then:
  - a *probe* run in the same worker prints a fingerprint of everything a run can observe (scratch
    files and their directories' mode and attributes; modules, builtins, the server module's globals;
    environment; signal dispositions and mask; umask, cwd; other processes; System V IPC objects; a lock
    on the solution; rlimits; and the counters that carried state from run to run before each run had
    namespaces of its own: its pids, the inode numbers of new files in /tmp and /dev/shm, System V IPC
    ids) and it must equal the fingerprint taken before the attack;
  - the next honest run scores 1;
  - no process of the sandbox uid is left but the idle workers', and none at all once the reward is
    closed.
An attack on the server itself (kill, stop, ptrace, starve it) must fail the run (never pass, never a
verifier error) and get the worker replaced.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from vt.rewards.code.reward import CodeReward
from vt.rewards.sandbox import placement
from vt.rewards.sandbox import warm as pool_mod
from vt.rewards.sandbox.cold import Limits, force_rmtree, prepare_code_dir

from .conftest import processes_matching

TEST_LIMIT_S = 2.0

PROBE = """
import builtins, ctypes, fcntl, json, os, platform, resource, signal, sys
def keyring(ring):
    buf = ctypes.create_string_buffer(4096)
    libc = ctypes.CDLL(None, use_errno=True)
    n = libc.syscall({"x86_64": 250, "aarch64": 219}[platform.machine()], 11, ring, buf, 4096)  # KEYCTL_READ
    return buf.raw[:n].hex() if n >= 0 else -ctypes.get_errno()
def scratch(d):
    st = os.stat(d)  # (its times are the run's own: a fresh tmpfs, mounted as the run starts)
    listing = sorted(os.listdir(d))
    with open(os.path.join(d, "probe"), "w"):
        pass
    return [oct(st.st_mode), st.st_uid, sorted(os.listxattr(d)), listing, os.stat(os.path.join(d, "probe")).st_ino]
def ipc_ids():
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(0, 4096, 0o1000 | 0o600)
    sem = libc.semget(0, 1, 0o1000 | 0o600)
    msg = libc.msgget(0, 0o1000 | 0o600)
    libc.shmctl(shm, 0, None), libc.semctl(sem, 0, 0), libc.msgctl(msg, 0, None)  # IPC_RMID
    return [shm, sem, msg]
def sysv(kind):  # (a warm run's /proc shows processes only: the objects are counted through ipc_ids instead)
    try:
        return open("/proc/sysvipc/" + kind).read().splitlines()[1:]
    except OSError as e:
        return type(e).__name__
def pids():
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return [os.getpid(), os.getppid(), child, sorted(int(p) for p in os.listdir("/proc") if p.isdigit())]
lock = open("/code/solution.py")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    locked = "free"
except OSError:
    locked = "held"
print(json.dumps({
    "scratch": [scratch("/tmp"), scratch("/dev/shm")], "pids": pids(), "ipc_ids": ipc_ids(),
    "modules": sorted(sys.modules),
    "builtins": sorted(dir(builtins)), "print": repr(builtins.print), "len": len([1, 2]),
    "main": sorted(vars(sys.modules["__main__"])),
    "env": sorted(os.environ.items()),
    "signals": [repr(signal.getsignal(s)) for s in range(1, signal.NSIG) if s not in (9, 19, 32, 33)],
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "umask": os.umask(0o22), "cwd": os.getcwd(),
    "others": [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())],
    "sysv": [sysv(k) for k in ("shm", "sem", "msg")],
    "lock": locked,
    "limits": [resource.getrlimit(getattr(resource, r)) for r in sorted(dir(resource)) if r.startswith("RLIMIT_")],
    "affinity": sorted(os.sched_getaffinity(0)),
    "keyrings": [keyring(ring) for ring in (-4, -5)],  # the uid's user and user-session keyrings
    "priority": os.getpriority(os.PRIO_PROCESS, 0), "scheduler": os.sched_getscheduler(0),
    "timer_slack": ctypes.CDLL(None).prctl(30, 0, 0, 0, 0),  # PR_GET_TIMERSLACK: inherited from the server
    "server_oom_score": open("/proc/%d/oom_score_adj" % os.getppid()).read(),
}, sort_keys=True))
"""

# What a run may leave behind, one attack per kind of state; each ends by printing "done".
STATE_ATTACKS = {
    # The counters a run could advance to tell the next run something (the warm-pool channel: the
    # next pid and the next inode number of /tmp survived the server's wipe; System V ids count up too).
    "counters": """
        import ctypes, os
        for _ in range(300):
            child = os.fork()
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
        for d in ("/tmp", "/dev/shm"):
            for i in range(300):
                open(os.path.join(d, str(i)), "w").close()
                os.unlink(os.path.join(d, str(i)))
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(50):
            libc.shmctl(libc.shmget(0, 4096, 0o1000 | 0o600), 0, None)
            libc.semctl(libc.semget(0, 1, 0o1000 | 0o600), 0, 0)
            libc.msgctl(libc.msgget(0, 0o1000 | 0o600), 0, None)
        shm = libc.shmget(0, 4096, 0o1000 | 0o600)  # and one left in place
    """,
    "files": """
        import os
        open("/tmp/left", "w").write("for the next run")
        os.makedirs("/tmp/d/e")
        open("/tmp/d/e/f", "w").write("x")
        os.chmod("/tmp/d/e", 0)
        os.chmod("/tmp/d", 0o500)
        open("/dev/shm/left", "w").write("x")
        os.setxattr("/tmp", "user.left", b"x")
        os.utime("/tmp", (1, 1))
        os.utime("/dev/shm", (2, 2))
        os.chmod("/dev/shm", 0o700)
        os.chmod("/tmp", 0o500)
    """,
    "interpreter": """
        import builtins, gc, os, sys, types
        sys.modules["planted"] = types.ModuleType("planted")
        builtins.PLANTED = True
        builtins.len = lambda x: 42
        sys.modules["__main__"].PLANTED = True
        for obj in gc.get_objects():  # the harness module and the server's objects, as inherited
            if isinstance(obj, types.ModuleType) and getattr(obj, "__name__", "") == "_harness":
                obj.SOLUTION = "/tmp/evil.py"
        os.umask(0o777)
        os.chdir("/")
        builtins.print("done")
        builtins.print = lambda *a, **k: None
    """,
    "environment": """
        import os
        os.environ["PLANTED"] = "1"
        os.putenv("PLANTED_TOO", "1")
    """,
    "signals": """
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, lambda *a: None)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGCHLD])
    """,
    "daemon-and-lock": """
        import fcntl, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                lock = open("/code/solution.py")
                fcntl.flock(lock, fcntl.LOCK_EX)
                while True:  # keeps writing: a survivor would show up in the next run's /tmp
                    open("/tmp/alive", "w").write(str(time.time()))
                    time.sleep(0.01)
            os._exit(0)
        time.sleep(0.2)
    """,
    "cpu-affinity": """
        import os
        server = os.getppid()  # the server (same uid) forked this run: move it, and every run after, elsewhere
        here = os.sched_getaffinity(server)
        elsewhere = (set(range(os.cpu_count())) - here) or ({min(here)} if len(here) > 1 else here)
        os.sched_setaffinity(server, elsewhere)
        assert os.sched_getaffinity(server) == elsewhere
    """,
    # Blocked by the kernel (the server is not dumpable, the sandbox holds no capability), and must stay so:
    # the server's OOM score (memory pressure would kill it before the runs) and its timer slack (inherited).
    "oom-score-and-timer-slack": """
        import os
        for name, value in (("oom_score_adj", "1000"), ("timerslack_ns", "100000000")):
            try:
                with open("/proc/%d/%s" % (os.getppid(), name), "w") as f:
                    f.write(value)
            except OSError:
                pass
    """,
    # A uid's keyrings outlive its processes (they belong to the sandbox's user namespace): refused outright.
    "keyrings": """
        import ctypes, platform
        libc = ctypes.CDLL(None, use_errno=True)
        add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
        for ring in (-4, -5):
            libc.syscall(add_key, b"user", b"left", b"for the next run", 16, ring)
    """,
    # One kind per attack: the server checks each kind's count before it scans /proc/sysvipc.
    "sysv-shm": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        IPC_CREAT, IPC_PRIVATE = 0o1000, 0
        assert libc.shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0o600) >= 0
        assert libc.shmget(4242, 1 << 16, IPC_CREAT | 0o600) >= 0
    """,
    "sysv-sem": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.semget(4243, 1, 0o1000 | 0o600) >= 0
    """,
    "sysv-msg": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.msgget(4244, 0o1000 | 0o600) >= 0
    """,
}


# A run has its server's uid. Before runs had PID namespaces of their own, the kernel let a run change the
# server's nice value, scheduling policy and rlimits from outside (setpriority, sched_setscheduler, prlimit:
# not being dumpable does not stop them), and every later run would have inherited them. Now the run's
# parent is its own namespace's init, and no pid of the server's can be named from the run: the attacks
# reach the run's own processes only.
SCHEDULING_ATTACKS = {
    "priority": """
        import os
        os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)  # was: the server and every run after it
        assert os.getpriority(os.PRIO_PROCESS, os.getppid()) == 19
    """,
    "priority-of-the-uid": """
        import os
        os.setpriority(os.PRIO_USER, os.getuid(), 19)  # every process of the uid the run can see
    """,
    "scheduler": """
        import os
        os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))
        assert os.sched_getscheduler(os.getppid()) == os.SCHED_IDLE
    """,
    "rlimits": """
        import os, resource
        parent = os.getppid()
        for name, value in (("RLIMIT_STACK", 1 << 16), ("RLIMIT_NOFILE", 32), ("RLIMIT_CORE", 0),
                            ("RLIMIT_SIGPENDING", 4), ("RLIMIT_MEMLOCK", 0), ("RLIMIT_CPU", 600)):
            resource.prlimit(parent, getattr(resource, name), (value, value))  # hard limits: no way back up
        assert resource.prlimit(parent, resource.RLIMIT_STACK) == (1 << 16, 1 << 16)
    """,
}


def block(src: str) -> str:
    return "<think>let me write it</think>\n```python\n" + textwrap.dedent(src).strip() + "\n```\n"


def stdio(output: str, inp: str = "") -> dict:
    return {"tests": [{"input": inp, "output": output}]}


HONEST = (stdio("7", "3 4"), block("a, b = map(int, input().split())\nprint(a + b)"))


@pytest.fixture(scope="module")
def reward():
    # One worker: every run of this module goes to the same warm server (unless an attack gets it replaced).
    with CodeReward(workers=1, test_time_limit_s=TEST_LIMIT_S, problem_time_limit_s=20) as r:
        assert r.pool is not None
        yield r
        uids = r.sandbox_uids
    assert processes_matching(uids) == []  # after every attack of this module, closing leaves nothing


def limits_of(reward, wall_s: float) -> Limits:
    """A run's limits as the reward sets them for a test of ``wall_s`` seconds."""
    c = reward.config
    return Limits(wall_s, c.memory_bytes, c.output_bytes, c.file_bytes, c.nproc, tmp_bytes=c.tmp_bytes)


def fingerprint(reward) -> bytes:
    with reward.pool.worker(textwrap.dedent(PROBE)) as worker:
        run = worker.run("stdin", b"", limits_of(reward, TEST_LIMIT_S * 2))
    assert run.status == "exited" and run.returncode == 0, run
    return run.stdout


def leftovers(reward) -> list[int]:
    # The sandbox uids' processes first, then the pool's: an init still exiting then is in the second list only.
    live = processes_matching(reward.sandbox_uids)
    idle = reward.pool.pids()
    return [p for p in live if p not in idle]


def assert_next_run_clean(reward):
    honest = reward([HONEST[0]], [HONEST[1]])[0]
    assert honest.score == 1.0, honest
    assert leftovers(reward) == []


@pytest.mark.parametrize("attack", sorted(STATE_ATTACKS))
def test_nothing_a_run_leaves_reaches_the_next_run(reward, attack):
    before = fingerprint(reward)
    src = textwrap.dedent(STATE_ATTACKS[attack]) + "\nprint('done')\n"
    r = reward([stdio("done")], [block(src)])[0]
    assert r.score == 1.0, r  # the attack ran to its end (and is a correct program)
    assert fingerprint(reward) == before
    assert_next_run_clean(reward)


@pytest.mark.parametrize("attack", sorted(SCHEDULING_ATTACKS))
def test_a_run_cannot_lower_its_servers_priority_or_limits(reward, attack):
    """The run itself keeps its verdict (it is a correct program); what it changed was its own init's
    (or its own processes'): the server keeps serving (not replaced), and the next run sees what the
    first one saw."""
    before, replaced = fingerprint(reward), reward.pool.replaced
    pids = reward.pool.server_pids()
    assert pids
    src = textwrap.dedent(SCHEDULING_ATTACKS[attack]) + "\nprint('done')\n"
    r = reward([stdio("done")], [block(src)])[0]
    assert r.score == 1.0, r
    assert reward.pool.replaced == replaced and reward.pool.server_pids() == pids
    assert fingerprint(reward) == before
    assert_next_run_clean(reward)


STDIO = """
import json, sys
def props(f):
    b = f.buffer
    d = {"type": type(f).__name__, "name": f.name, "mode": f.mode, "encoding": f.encoding, "errors": f.errors,
         "line_buffering": f.line_buffering, "write_through": f.write_through, "seekable": f.seekable(),
         "isatty": f.isatty(), "buffer": type(b).__name__, "raw": type(b.raw).__name__, "raw_name": b.raw.name,
         "raw_mode": b.raw.mode, "closefd": b.raw.closefd, "blksize": b.raw._blksize, "fileno": f.fileno()}
    for what, tell in (("tell", f.tell), ("buffer_tell", b.tell)):
        try:
            d[what] = tell()
        except OSError as e:  # io.UnsupportedOperation too
            d[what] = type(e).__name__
    return d
first = props(sys.stdin)
line = sys.stdin.readline()
std = [first, props(sys.stdin), props(sys.stdout), props(sys.stderr)]
dunder = [sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__]
print(json.dumps([std, dunder, line, sys.stdin.read()], sort_keys=True))
"""


def test_a_warm_run_gets_the_stdio_of_a_fresh_interpreter(reward):
    """A run's child is a fork of the server, whose own stdio was made for the protocol pipes: the child makes
    its stdin, stdout and stderr afresh, and every property a program can read of them is what a cold
    sandbox's fresh interpreter gives it, before and after reading, on the same input."""
    stdin = b"first line\nthe rest\n"
    limits = limits_of(reward, TEST_LIMIT_S * 2)
    with reward.pool.worker(STDIO) as worker:
        warm = worker.run("stdin", stdin, limits)
    root = Path(tempfile.mkdtemp(prefix="vt-test-"))
    try:
        cold = reward.sandbox.run(prepare_code_dir(root, STDIO), "stdin", stdin, limits, reward.sandbox_uids[0]
                                  if reward.sandbox_uids else None)
    finally:
        force_rmtree(root)
    assert warm.status == cold.status == "exited" and warm.returncode == cold.returncode == 0, (warm, cold)
    assert json.loads(warm.stdout) == json.loads(cold.stdout)


def test_tests_of_one_sample_do_not_see_each_other(reward):
    """All tests of a sample run in the same warm sandbox, each in a fresh child: the second test sees
    no file, module or environment the first one made."""
    src = """
        import os, sys, types
        fresh = not os.path.exists("/tmp/seen") and "seen" not in sys.modules and "SEEN" not in os.environ
        open("/tmp/seen", "w").write("x")
        sys.modules["seen"] = types.ModuleType("seen")
        os.environ["SEEN"] = "1"
        print("fresh" if fresh else "stale", input())
    """
    rec = {"tests": [{"input": str(i), "output": f"fresh {i}"} for i in range(4)]}
    r = reward([rec], [block(src)])[0]
    assert r.score == 1.0 and r.details["tests_passed"] == 4, r


@pytest.mark.parametrize("record", [HONEST[0], {"tests": [{"fn_name": "add", "args": [3, 4], "expected": 7}]},
                                    {"tests": [{"program": "assert add(3, 4) == 7\n"}]}],
                         ids=["stdin", "call", "program"])
def test_a_run_that_rebinds_exit_still_ends_in_its_own_process(reward, record):
    """The run's child is a fork of the server: whatever it rebinds (os._exit, sys.exit, atexit), it ends
    without ever returning into the server's loop."""
    src = """
        import atexit, os, sys
        os._exit = lambda *a: None
        sys.exit = lambda *a: None
        atexit.register(os._exit, 0)
        def add(a, b):
            return a + b
        if __name__ == "__main__":
            a, b = map(int, input().split())
            print(add(a, b))
    """
    r = reward([record], [block(src)])[0]
    assert r.score == 1.0, r
    assert_next_run_clean(reward)


def test_a_run_starts_without_modules_that_hook_fork_and_they_work_when_imported(reward):
    """As in a fresh interpreter, threading and random are not imported when a run starts (the server
    never imports a module with an at-fork hook: it would run in every forked process); a run that imports
    them gets working ones, and its non-daemon threads are waited for at exit, as the interpreter does."""
    src = """
        import sys
        print(sorted(m for m in ("threading", "random") if m in sys.modules))
        import random, threading, time
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread", random.random() < 1))).start()
    """
    r = reward([stdio("[]\nthread True")], [block(src)])[0]
    assert r.score == 1.0, r


def test_the_pool_is_warm(reward):
    """Honest runs do not replace the server: it is the same process run after run."""
    assert_next_run_clean(reward)
    pids, replaced = reward.pool.server_pids(), reward.pool.replaced
    res = reward([HONEST[0]] * 6, [HONEST[1]] * 6)
    assert [x.score for x in res] == [1.0] * 6
    assert reward.pool.server_pids() == pids and reward.pool.replaced == replaced


# ---- attacks on the server -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "src, kinds",
    [
        # print the right answer, then kill the run's parent: its namespace's init, which the kernel shields
        # from every signal sent from inside its namespace (SIGKILL included): the run ends as it would
        ("import os, signal\nprint('7', flush=True)\nos.kill(os.getppid(), signal.SIGKILL)", (None,)),
        # every process the run may signal: its own (init is spared by the kernel), itself included
        ("import os, signal\nprint('7', flush=True)\nos.kill(-1, signal.SIGKILL)", ("runtime_error",)),
        # stop its parent: an init ignores SIGSTOP from its own namespace, so the run just ends (and passes)
        ("import os, signal\nprint('7', flush=True)\nos.kill(os.getppid(), signal.SIGSTOP)", (None,)),
        # from a daemon, after the run's main process has exited
        ("import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.05)\n"
         "    os.kill(1, signal.SIGKILL)\n    os.kill(2, signal.SIGKILL)\n    os._exit(0)\nprint('7')", ("runtime_error", None)),
    ],
    ids=["kill-parent", "kill-all", "stop-parent", "daemon-kills-init"],
)
def test_a_run_can_kill_only_its_own_processes_never_the_server(reward, src, kinds):
    """What a run signals is its own run (its parent is the init of its namespace): it may kill itself, never
    the server, which stays (not replaced); a pass only for its own correct output."""
    assert_next_run_clean(reward)  # a warm server to begin with
    replaced, pids = reward.pool.replaced, reward.pool.server_pids()
    t0 = time.monotonic()
    r = reward([HONEST[0]], [block(src)])[0]
    assert (r.failure if r.score == 0.0 else None) in kinds, r
    assert reward.pool.replaced == replaced and reward.pool.server_pids() == pids
    assert time.monotonic() - t0 < TEST_LIMIT_S + pool_mod.REPLY_GRACE_S + 5
    assert_next_run_clean(reward)


def test_signals_to_the_server_are_ignored(reward):
    src = """
        import os, signal
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                  signal.SIGPIPE, signal.SIGTSTP, signal.SIGQUIT, signal.SIGXCPU):
            os.kill(os.getppid(), s)
        print(7)
    """
    replaced = reward.pool.replaced
    r = reward([HONEST[0]], [block(src)])[0]
    assert r.score == 1.0, r
    assert reward.pool.replaced == replaced
    assert_next_run_clean(reward)


# Every way a process has into its parent's memory and fds (same uid): what it got, or "blocked".
PROBE_PARENT = """
import ctypes, os
def probe(everyone=False):
    # The parent, or (everyone) every process of the namespace but its init and this one.
    libc = ctypes.CDLL(None, use_errno=True)
    got = []
    targets = [os.getppid()]
    if everyone:
        targets = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
    for pid in targets:
        for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
            if libc.ptrace(request, pid, None, None) == 0:
                got.append("ptrace %d of %d" % (request, pid))
        for what in ["mem", "environ", "maps"] + ["fd/%d" % fd for fd in range(12)]:
            try:
                with open("/proc/%d/%s" % (pid, what), "rb") as f:
                    f.read(1)
                got.append("%s of %d" % (what, pid))
            except OSError:
                pass
        class IoVec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(64)
        local, remote = IoVec(ctypes.addressof(buf), 64), IoVec(0x400000, 64)
        if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
            got.append("process_vm_readv of %d" % pid)
    return ",".join(got) or "blocked"
"""


def test_the_server_cannot_be_traced_or_read(reward):
    """Non-dumpable: a run (same uid) can neither ptrace its server nor open its memory or fds."""
    blocked = reward([stdio("blocked")], [block(PROBE_PARENT + "print(probe())\n")])[0]
    assert blocked.score == 1.0, blocked
    assert_next_run_clean(reward)


@pytest.mark.parametrize("pool", [True, False], ids=["warm", "cold"])
def test_a_program_tests_process_cannot_be_traced_or_read_by_the_solution(pool):
    """Program mode: the test process, which holds the nonce and writes the verdict (cold: the solution's
    parent, not dumpable; warm: the server's tester, in the server's PID namespace, which the run cannot
    even see), is out of the solution's reach, and so is every other process it can see in its namespace.
    (A ptrace that worked would stop it: the test then reads as a timeout.)"""
    with CodeReward(workers=1, pool=pool, test_time_limit_s=TEST_LIMIT_S) as r:
        test = "assert probe(everyone=True) == 'blocked', probe(everyone=True)\n"
        got = r([{"tests": [{"program": test}]}], [block(PROBE_PARENT + SEES_TESTER)])[0]
        assert got.score == 1.0, got
        # What the solution sees: its parent and itself (warm: its init), never the tester.
        # (cold: bwrap's init, the test process, the solution's; warm: the run's init, the solution's)
        seen = [1, 2] if pool else [1, 2, 3]
        test = f"assert not sees_tester() and visible() == {seen}, visible()\n"
        got = r([{"tests": [{"program": test}]}], [block(SEES_TESTER)])[0]
    assert got.score == 1.0, got


# ---- attacks on the tester (warm program tests) --------------------------------------------------

# The tester runs the test program of every program run of its worker; the solution's process has its uid.
SEES_TESTER = """
import os
def tester():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/comm" % p) as f:
                    if f.read() == "vt-tester\\n":
                        return int(p)
            except OSError:
                pass
    return None
def sees_tester():
    return tester() is not None
def visible():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
"""
# A run's attempts on every process it could reach: before runs had PID namespaces of their own, the
# solution's process found the tester (same uid, same namespace) and could kill, stop, renice, starve or
# limit it. Now it finds nothing but its own run; each attack ends in a test that is honest.
TESTER_ATTACKS = {
    "kill-all": "os.fork() == 0 and (os.kill(-1, 9), os._exit(0))",
    "stop-all": "os.fork() == 0 and (os.kill(-1, 19), os._exit(0))",
    "priority-of-the-uid": "os.setpriority(os.PRIO_USER, os.getuid(), 19)",
    "every-pid": "for p in range(1, 400):\n    try:\n        p != os.getpid() and os.kill(p, 19)\n    except OSError:\n        pass",
    # A daemon that outlives the run and goes for the next run's processes: it dies with its run.
    "daemon": "os.fork() == 0 and (os.setsid(), __import__('time').sleep(0.3), os.kill(-1, 19))",
}
PROGRAM = {"tests": [{"program": "assert add(3, 4) == 7\n"}]}
ADD = "import os, resource\ndef add(a, b):\n    return a + b\n"


@pytest.mark.parametrize("attack", sorted(TESTER_ATTACKS))
def test_a_run_that_attacks_every_process_it_can_reach_leaves_the_tester_and_server_untouched(reward, attack):
    """The run's honest verdict stands or it fails; the tester and the server are the same processes after
    it (not replaced), the next program run passes, and nothing of the run is left."""
    assert reward([PROGRAM], [block(ADD)])[0].score == 1.0  # a tester exists
    replaced, pids = reward.pool.replaced, reward.pool.server_pids()
    r = reward([PROGRAM], [block(ADD + TESTER_ATTACKS[attack] + "\n")])[0]
    assert r.failure != "verifier_error", r
    again = reward([PROGRAM], [block(ADD)])[0]
    assert again.score == 1.0, (attack, r, again)
    assert reward.pool.replaced == replaced
    if r.failure != "timeout":  # a run cut off mid-test gets its tester replaced (it may be mid-run): by design
        assert reward.pool.server_pids() == pids
    assert_next_run_clean(reward)


def test_the_tester_serves_run_after_run(reward):
    """Honest program runs keep one tester (and one server): no run pays for a fresh one."""
    assert reward([PROGRAM], [block(ADD)])[0].score == 1.0
    pids = reward.pool.server_pids()
    res = reward([PROGRAM] * 6, [block(ADD)] * 6)
    assert [x.score for x in res] == [1.0] * 6
    assert reward.pool.server_pids() == pids


def test_a_run_that_fills_its_memory_fails_and_the_next_run_has_all_of_it():
    budget = 256 << 20
    with CodeReward(workers=1, test_time_limit_s=10, memory_bytes=budget) as r:
        if r.sandbox.cgroups is None:
            pytest.skip("no writable memory cgroup on this host (cgroup v2 delegation or v1 as root)")
        # Forked children, each under the address-space limit, together far over the worker's cgroup.
        hog = """
            import os, time
            for _ in range(6):
                if os.fork() == 0:
                    block = b'x' * (120 << 20)
                    time.sleep(5)
                    os._exit(0)
            ok = True
            while True:
                try:
                    ok = os.wait()[1] == 0 and ok
                except ChildProcessError:
                    break
            print('survived' if ok else 'killed')
        """
        # System V shared memory outlives its process, charged to the cgroup until removed.
        shm = """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.shmat.restype = ctypes.c_void_p
            seg = libc.shmget(0, 160 << 20, 0o1000 | 0o600)
            addr = libc.shmat(seg, None, 0)
            ctypes.memset(addr, 1, 160 << 20)
            print('survived')
        """
        honest = block("b = b'y' * (160 << 20)\nprint(len(b) >> 20)")
        for attack in (hog, shm):
            res = r([stdio("survived")], [block(attack)])[0]
            if attack is hog:
                assert res.score == 0.0 and res.failure in ("memory", "runtime_error", "wrong"), res
            again = r([stdio("160")], [honest])[0]
            assert again.score == 1.0, (attack, again)
        uids = r.sandbox_uids
    assert processes_matching(uids) == []


def test_fork_bomb_then_the_next_run_is_clean(reward):
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = reward([HONEST[0]], [block(src)])[0]
    assert r.score == 0.0 and r.failure in ("timeout", "runtime_error"), r
    assert_next_run_clean(reward)


@pytest.mark.parametrize(
    "src",
    ["while True:\n    pass", "import time\ntime.sleep(100)", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(100)"],
    ids=["busy", "sleep", "closed-stdio"],
)
def test_a_run_that_never_returns_times_out_and_the_next_run_is_clean(reward, src):
    t0 = time.monotonic()
    r = reward([HONEST[0]], [block(src)])[0]
    assert r.score == 0.0 and r.failure == "timeout", r
    assert time.monotonic() - t0 < TEST_LIMIT_S + 2
    assert_next_run_clean(reward)


# ---- what a run can find in its own memory -------------------------------------------------------

SCAN_OWN_MEMORY = textwrap.dedent("""
    import ctypes, re
    def scan(pattern):
        # Reads its own anonymous memory (heap, stack, mmaps) directly: a solution's process may be
        # non-dumpable (forked by the test process), so /proc/self/mem may be closed to it.
        found = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] not in ("[heap]", "[stack]")):
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found += re.findall(pattern, ctypes.string_at(lo, hi - lo))
        return found
""")



def test_the_solution_never_holds_the_test_program(reward):
    """Program tests: the solution's process is forked before the test process reads its request, and
    the server copies each request into a memfd without keeping it: the test code (here, a canary in a
    comment) appears nowhere in the solution's memory."""
    canary = "VT-CANARY-" + secrets.token_hex(8)
    src = SCAN_OWN_MEMORY + "\ndef leaked():\n    return [m.decode() for m in scan(rb'VT-CANARY-[0-9a-f]{16}')]\n"
    test = f"# {canary}\nassert leaked() == [], leaked()\n"
    r = reward([{"tests": [{"program": test}] * 2}], [block(src)])[0]
    assert r.score == 1.0, r


def test_a_run_never_finds_an_earlier_runs_output_in_its_memory(reward):
    """Each run is forked from the server; the server keeps no copy of what a run printed."""
    printer = block("import secrets\nprint('VT-OUTPUT-' + secrets.token_hex(8) * 200)")
    assert reward([stdio("x")], [printer])[0].failure == "wrong"
    src = SCAN_OWN_MEMORY + "\nprint(len(scan(rb'VT-OUTPUT-[0-9a-f]{16}')))\n"
    r = reward([stdio("0")], [block(src)])[0]
    assert r.score == 1.0, r


# ---- the server misbehaving ----------------------------------------------------------------------

FAKE_SERVERS = {
    # replies garbage to the first request
    "garbage": "os.write(1, (20).to_bytes(8, 'big') + b'not json at all!!!!!')",
    # claims more stdout than the cap allows
    "oversized": "h = json.dumps({'status': 'exited', 'returncode': 0, 'wall_s': 0.1, 'clean': True, "
    "'stdout': 1 << 40, 'stderr': 0}).encode()\nos.write(1, len(h).to_bytes(8, 'big') + h)",
    # never replies
    "silent": "time.sleep(100)",
    # dies mid-run
    "dies": "os._exit(3)",
}


def server_with(tmp_path, monkeypatch, part: str, edit) -> None:
    """The pool's workers start a copy of the server whose ``part`` (a file of it) is ``edit(its source)``."""
    server = tmp_path / "server"
    shutil.copytree(pool_mod.SERVER_DIR, server)
    (server / part).write_text(edit((server / part).read_text()))
    monkeypatch.setattr(pool_mod, "SERVER_DIR", server)


@pytest.mark.parametrize("how", sorted(FAKE_SERVERS))
def test_a_misbehaving_server_fails_the_run_and_is_replaced(tmp_path, monkeypatch, how):
    fake = tmp_path / "fake_server.py"
    fake.write_text(  # the protocol's pipes are the fds its first argument names, as the real server's
        "import json, os, sys, time\n"
        "requests, replies = (int(fd) for fd in sys.argv[1].split(','))\n"
        "os.dup2(requests, 0)\n"
        "os.dup2(replies, 1)\n"
        "h = json.dumps({'ready': True}).encode()\n"
        "os.write(1, len(h).to_bytes(8, 'big') + h)\n"
        "os.read(0, 1 << 16)\n" + FAKE_SERVERS[how] + "\ntime.sleep(100)\n"
    )
    server_with(tmp_path, monkeypatch, "pool_server.py", lambda _: fake.read_text())
    with CodeReward(workers=1, test_time_limit_s=1.0) as r:
        t0 = time.monotonic()
        res = r([HONEST[0]], [HONEST[1]])[0]
        assert res.score == 0.0 and res.failure in ("runtime_error", "timeout"), res
        assert time.monotonic() - t0 < 1.0 + pool_mod.REPLY_GRACE_S + 3
        assert r.pool.replaced == 1 and r.pool.workers[0].proc is None  # killed; the next run starts a fresh one
        uids = r.sandbox_uids
    assert processes_matching(uids) == []


# ---- slots ---------------------------------------------------------------------------------------


def test_concurrent_slots_never_share_a_uid_and_close_leaves_nothing():
    with CodeReward(workers=2, test_time_limit_s=5) as r:
        if not r.sandbox_uids:
            pytest.skip("per-sandbox uids exist only when the grader runs as root (CI does)")
        src = block("import os, time\ntime.sleep(0.5)\nprint(os.getuid(), os.getpid(), os.getppid())")
        res = r([stdio("never")] * 2, [src] * 2)
        seen = [x.details["stdout"] for x in res]
        assert sorted(seen) == sorted(f"{u} 2 1" for u in r.sandbox_uids), seen  # each under its own run's init
        uids = r.sandbox_uids
        assert processes_matching(uids)  # the warm workers
    assert processes_matching(uids) == []


# ---- placement -----------------------------------------------------------------------------------

AFFINITY = "import os\nprint(sorted(os.sched_getaffinity(0)))\n"


def affinity_of_runs(worker, limits) -> list[int]:
    """The CPUs a run of this worker may use (a run inherits its server's affinity)."""
    worker.load(AFFINITY)
    try:
        run = worker.run("stdin", b"", limits)
    finally:
        worker.unload()
    assert run.status == "exited" and run.returncode == 0, run
    return json.loads(run.stdout)


def test_each_worker_runs_on_a_cpu_of_its_own_and_gives_it_back(tmp_path, monkeypatch):
    """Every process of a worker's sandbox runs on the worker's CPU; no two workers share one while a
    free one is left (the claim is a lock per CPU, held per open file, so workers of this process and of
    any other conflict alike); a worker that finds every CPU taken runs unpinned and still scores; a
    closed reward's CPUs can be claimed again. The locks live in a directory of this test's own, so that
    the module's warm worker and other test processes' workers hold none of them. On a single CPU the
    second worker is the one that finds none free."""
    allowed = sorted(os.sched_getaffinity(0))
    locks, claim_cpu = str(tmp_path / "locks"), pool_mod.claim_cpu
    monkeypatch.setattr(pool_mod, "claim_cpu", lambda directory=None: claim_cpu(directory or locks))
    claims = []
    try:
        with CodeReward(workers=2, test_time_limit_s=5) as r:
            limits = limits_of(r, 5)
            seen = [affinity_of_runs(w, limits) for w in r.pool.workers]
            cpus = [w.cpu for w in r.pool.workers if w.cpu is not None]
            assert seen == [[w.cpu] if w.cpu is not None else allowed for w in r.pool.workers], seen
            assert len(set(cpus)) == len(cpus) == min(2, len(allowed)) and set(cpus) <= set(allowed), cpus
            while (claim := pool_mod.claim_cpu()) is not None:  # every CPU left, as other processes could
                claims.append(claim)
            assert not {c for c, _ in claims} & set(cpus)
            with CodeReward(workers=1, test_time_limit_s=5) as late:
                assert affinity_of_runs(late.pool.workers[0], limits) == allowed
                assert late.pool.workers[0].cpu is None
                assert late([HONEST[0]], [HONEST[1]])[0].score == 1.0
        claim = pool_mod.claim_cpu()
        assert claim is not None and claim[0] in cpus
        claims.append(claim)
    finally:
        for _, fd in claims:
            os.close(fd)


def test_cpu_claims_and_solutions_never_follow_someone_elses_paths(tmp_path, monkeypatch):
    """The lock directory sits in a shared sticky directory: a link or a foreign, writable directory
    under its name means no pinning, never a file made where the link points. Without a usable tmpfs the
    pool keeps its files in the default temporary directory and works the same."""
    monkeypatch.setattr(placement, "HOST_TMPFS", str(tmp_path))
    assert placement.scratch_base() == str(tmp_path)
    lock_dir = tmp_path / f"vt-cpus-{os.getuid()}"
    target = tmp_path / "elsewhere"
    target.mkdir()
    lock_dir.symlink_to(target)
    assert placement.claim_cpu() is None and list(target.iterdir()) == []
    lock_dir.unlink()
    lock_dir.mkdir(mode=0o777)
    os.chmod(lock_dir, 0o777)
    assert placement.claim_cpu() is None
    os.chmod(lock_dir, 0o700)
    claim = placement.claim_cpu()
    assert claim is not None
    os.close(claim[1])
    monkeypatch.setattr(placement, "HOST_TMPFS", str(tmp_path / "missing"))
    assert placement.scratch_base() is None
    with CodeReward(workers=1, test_time_limit_s=5) as r:
        assert str(r.pool.workers[0].root.parent) == tempfile.gettempdir()
        assert r([HONEST[0]], [HONEST[1]])[0].score == 1.0


def test_where_the_init_cannot_share_the_server_s_memory_it_is_a_fork_and_runs_look_the_same(tmp_path, monkeypatch):
    """Each run's init is cloned with the server's memory (inits.py) where it can; where it cannot (a Python that
    checks its C stack, a kernel that refuses the flags) it is a plain fork, and a run is graded and sees its
    namespace as with the clone: PID 2 under PID 1, its /proc, a program test's tester."""
    marker = 'self.vm = sys.version_info < (3, 14) and hasattr(_libc, "clone")'

    def forking(source):
        assert source.count(marker) == 1
        return source.replace(marker, "self.vm = False")

    server_with(tmp_path, monkeypatch, "inits.py", forking)
    seen = block("import os\nprint(os.getpid(), os.getppid(), sorted(os.listdir('/proc')))")
    good = block("def add(a, b):\n    return a + b\n")
    right, wrong = ({"tests": [{"program": f"assert add(3, 4) == {n}\n"}]} for n in (7, 8))
    with CodeReward(workers=1, test_time_limit_s=TEST_LIMIT_S) as r:
        view = r([stdio("x")], [seen])[0]
        assert view.failure == "wrong" and view.details["stdout"] == "2 1 ['1', '2', 'self', 'thread-self']", view
        assert [x.score for x in r([HONEST[0], right, wrong], [HONEST[1], good, good])] == [1.0, 1.0, 0.0]
        assert r.pool.replaced == 0
        uids = r.sandbox_uids
    assert processes_matching(uids) == []


def test_without_fd_passing_program_tests_take_the_harness_s_own_program_mode(tmp_path, monkeypatch):
    """A sandbox Python without socket.send_fds (< 3.9) cannot feed a tester: the server runs program tests as
    the cold path does (the harness forks the solution's process from the test's) and grades them alike."""
    server_with(tmp_path, monkeypatch, "pool_server.py",
                lambda source: source.replace("import socket\n", "import socket\ndel socket.send_fds\n", 1))
    good = block("def add(a, b):\n    return a + b\n")
    right, wrong = ({"tests": [{"program": f"assert add(3, 4) == {n}\n"}]} for n in (7, 8))
    with CodeReward(workers=1, test_time_limit_s=TEST_LIMIT_S) as r:
        assert [x.score for x in r([right, wrong], [good, good])] == [1.0, 0.0]
        got = r([{"tests": [{"program": "assert not sees_tester()\n"}]}], [block(SEES_TESTER)])[0]
        assert got.score == 1.0, got  # no tester was started
        uids = r.sandbox_uids
    assert processes_matching(uids) == []


def test_a_server_that_cannot_make_a_runs_namespaces_is_a_verifier_error_never_a_wrong_answer(tmp_path, monkeypatch):
    """Every run starts in namespaces the server makes (a PID, mount and IPC namespace, a /proc). Where the host
    refuses one, no code of the run ever ran: a sandbox error (score None), never a 0 the answer would be
    blamed for. The server checks one empty run before it says ready; a failure after that is reported by
    the run's init, and the server is replaced."""
    marker = "            drop_capabilities()\n            if _libc.prctl(PR_SET_NO_NEW_PRIVS"

    def inject(source):
        assert source.count(marker) == 1
        return source.replace(marker, "            if os.path.exists('/code/fail-setup'):\n"
                                      "                raise OSError('injected')\n" + marker)

    server_with(tmp_path, monkeypatch, "inits.py", inject)
    with CodeReward(workers=1, test_time_limit_s=TEST_LIMIT_S) as r:
        worker = r.pool.workers[0]
        assert r([HONEST[0]], [HONEST[1]])[0].score == 1.0
        (worker.code_dir / "fail-setup").touch()
        scores = [x.score for x in r([HONEST[0]] * 3, [HONEST[1]] * 3)]
        assert scores[-1] is None and set(scores) <= {1.0, None}, scores  # each run's init is made at its request
        failed = r([HONEST[0]], [HONEST[1]])[0]  # a fresh server's own check fails: it never starts
        assert failed.score is None and "sandbox" in failed.details["reason"], failed
        (worker.code_dir / "fail-setup").unlink()
        assert r([HONEST[0]], [HONEST[1]])[0].score == 1.0
        uids = r.sandbox_uids
    assert processes_matching(uids) == []
