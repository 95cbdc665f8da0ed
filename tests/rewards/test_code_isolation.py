"""What a run can reach beyond itself, cold and warm, as root and as an ordinary user, within a run and across
runs (issue 46, items 1 and 2). test_unprivileged.py runs this file (with the other sandbox attack suites)
again as an unprivileged uid.

- Within a run: no process the run can see holds a host pipe or file that carries requests, tests or
  verdicts. As an ordinary user, bwrap's init (PID 1 of a cold sandbox) is a dumpable process of the run's
  own uid, so whatever it holds is open to the run through /proc/1/fd: it now holds /dev/null and the run's
  own stderr only (the channels reach the harness as fds bwrap's init closes). A warm run sees only its
  own namespace: its init (which holds nothing) and itself.
- Across runs: a run reads every counter it could use to learn what the run before it did (pids, the inode
  numbers of new files in /tmp and /dev/shm, System V IPC ids, the processes /proc lists, the host-wide
  counters of /proc) and then moves them all by an amount of its own; every run of the sequence, warm,
  must read exactly what a fresh cold sandbox reads (cold: the host-wide files masked empty; warm: its /proc
  holds process directories only).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from vt.rewards.code.reward import CodeReward

TEST_LIMIT_S = 4.0


def block(src: str) -> str:
    return "```python\n" + textwrap.dedent(src).strip() + "\n```\n"


# Every fd of every other process the run can open, read or write, except what is its own already (its
# stdin, stdout, stderr, seen as the same pipe or file) and /dev/null. Reads (non-blocking, up to 1 MiB) look
# for the canary of the run's own test code; writes put a forged verdict line and a forged pool reply.
REACH = """
import json, os, stat
def reach(canary=b""):
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat("/proc/self/fd/" + fd)
            mine.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    forged = b"\\n" + b"0" * 32 + b'{"ok": true}\\n'
    reply = json.dumps({"status": "exited", "returncode": 0, "wall_s": 0.0, "clean": True, "stdout": 0,
                        "stderr": 0}).encode()
    reply = len(reply).to_bytes(8, "big") + reply
    got = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            path = "/proc/%s/fd/%s" % (pid, fd)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in mine or (stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1):
                continue  # its own stdio, or /dev/null (and the other memory devices)
            for flags in (os.O_RDONLY, os.O_WRONLY):
                try:
                    f = os.open(path, flags | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    if flags == os.O_RDONLY:
                        data = os.read(f, 1 << 20)
                        got.append("%s read%s" % (path, " CANARY" if canary and canary in data else ""))
                    else:
                        os.write(f, forged + reply)
                        got.append("%s written" % path)
                except OSError:
                    got.append("%s opened" % path)
                finally:
                    os.close(f)
    return got
"""


@pytest.mark.parametrize("pool", [True, False], ids=["warm", "cold"])
def test_no_process_a_run_can_see_holds_its_request_or_a_verdict_stream(pool):
    """A program test whose code carries a canary: the solution opens every fd of every process it can
    see; it reaches none (so it can neither read the tests and their nonce nor forge a verdict or a pool
    reply), and wrong solutions graded after it on the same workers score 0."""
    canary = "VT-REQUEST-CANARY-7f3a"
    test = f"# {canary}\nassert reach({canary.encode()!r}) == [], reach({canary.encode()!r})\n"
    wrong = block("def add(a, b):\n    return -1\n")
    with CodeReward(workers=1, pool=pool, test_time_limit_s=TEST_LIMIT_S) as r:
        # stdin mode too: the attack prints what it reached; an empty list is the only right output.
        res = r([{"tests": [{"program": test}]}, {"tests": [{"input": "", "output": "[]"}]}],
                [block(REACH), block(REACH + "\nprint(reach())\n")])
        assert [x.score for x in res] == [1.0, 1.0], res
        after = r([{"tests": [{"program": "assert add(3, 4) == 7\n"}]}] * 3, [wrong] * 3)
        assert [x.score for x in after] == [0.0] * 3, after


# Reads every counter a run could use as a channel from the run before it, prints them, then moves each by
# an amount of its own (its input): forks, files in /tmp and /dev/shm, System V objects (one left in place).
CHANNELS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def new_ino(d):
    path = os.path.join(d, "probe")
    with open(path, "w"):
        pass
    ino = os.stat(path).st_ino
    os.unlink(path)
    return ino
def child_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
def host_counters():  # how many bytes (entries) each shows: 0 when masked, -1 when absent, -2 refused
    out = []
    for name in ("stat", "vmstat", "loadavg", "uptime", "meminfo", "schedstat", "interrupts", "diskstats"):
        try:
            with open("/proc/" + name) as f:
                out.append(len(f.read()))
        except FileNotFoundError:
            out.append(-1)
        except OSError:
            out.append(-2)
    try:
        out.append(len(os.listdir("/proc/sys/fs")))
    except FileNotFoundError:
        out.append(-1)
    except OSError:
        out.append(-2)
    return out
shm = libc.shmget(0, 4096, 0o1000 | 0o600)
libc.shmctl(shm, 0, None)
print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "child": child_pid(),
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "tmp": new_ino("/tmp"), "shm": new_ino("/dev/shm"), "sysv": shm,
    "host": host_counters(),
}, sort_keys=True))
n = int(input())
for _ in range(n):
    child_pid()
for d in ("/tmp", "/dev/shm"):
    for i in range(n):
        open(os.path.join(d, "f%d" % i), "w").close()
for _ in range(n // 10):
    libc.shmctl(libc.shmget(0, 4096, 0o1000 | 0o600), 0, None)
libc.shmget(0, 4096, 0o1000 | 0o600)
"""


def test_a_warm_run_reads_what_a_fresh_sandbox_reads_whatever_ran_before():
    """The issue's channel: runs of one worker, each moving the counters by a different amount after
    reading them. Every warm run reads exactly the cold sandbox's values, so no run can tell what the run
    before it did (or whether it passed); the host-wide counters read as empty."""
    amounts = [0, 200, 7, 150, 1, 90, 33, 120]
    with CodeReward(workers=1, pool=False, test_time_limit_s=TEST_LIMIT_S) as cold:
        fresh = cold([{"tests": [{"input": "0", "output": "x"}]}], [block(CHANNELS)])[0]
    assert fresh.failure == "wrong", fresh
    expected = json.loads(fresh.details["stdout"])
    assert all(v in (0, -1) for v in expected["host"]), expected["host"]  # masked, or not in this kernel
    with CodeReward(workers=1, test_time_limit_s=TEST_LIMIT_S) as warm:
        assert warm.pool is not None
        res = warm([{"tests": [{"input": str(n), "output": "x"}]} for n in amounts], [block(CHANNELS)] * len(amounts))
    seen = [json.loads(x.details["stdout"]) for x in res]
    assert all(x.failure == "wrong" for x in res), res
    # A warm run's /proc shows processes only (no host-wide file at all); the cold one masks them.
    hosts = [x.pop("host") for x in seen]
    assert all(v == -1 for host in hosts for v in host), hosts
    expected.pop("host")
    assert seen == [expected] * len(amounts), (expected, seen)
