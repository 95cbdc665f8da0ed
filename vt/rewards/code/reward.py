"""The code reward: the last fenced Python code block of the answer, run against the record's tests in the
sandbox; 1 when every test passes, else 0 with the failure kind.

A sample's tests run one after another in one warm sandbox of the pool (sandbox/warm.py), each test in its own
forked child with the per-test limits; tests stop at the first failure and when the per-problem time budget is
spent. ``pool=False`` (and unsandboxed mode) runs each test in a cold sandbox of its own (sandbox/cold.py): same
verdicts, slower. Failure kinds: wrong, timeout, runtime_error, output_limit, memory, format (no Python code
block); a sandbox that could not start is a verifier error, and nothing a solution prints, returns or raises is
(tests/rewards/test_code_verdicts.py).
"""
from __future__ import annotations

import dataclasses
import queue
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vt.rewards.base import RewardFunction, RewardResult, answer_region, failed, passed, verifier_error
from vt.rewards.code.formats import code_tests
from vt.rewards.code.grading import run_test
from vt.rewards.code.tests import CodeTest
from vt.rewards.registry import CodeConfig
from vt.rewards.sandbox.cold import Limits, Sandbox, force_rmtree, prepare_code_dir
from vt.rewards.sandbox.warm import SandboxPool

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


def last_code_block(text: str) -> tuple[str, str] | None:
    """(language tag, code) of the last complete fenced block, or None."""
    last = None
    for m in _FENCE_RE.finditer(text):
        last = m
    if last is None:
        return None
    return last.group(1).lower(), last.group(2)


class CodeReward(RewardFunction):
    """1 if the completion's last Python code block passes every test in the sandbox, else 0."""

    domain = "code"
    streams = True  # score_batch maps score_one over the items

    def __init__(self, config: CodeConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or CodeConfig(), **overrides)
        c = self.config
        self.sandbox = Sandbox(c.python, c.allow_unsandboxed, slots=c.workers)
        uids = self.sandbox.uids or [None] * c.workers
        # Unsandboxed runs keep the cold path: the pool's guarantees rest on the sandbox's namespaces.
        self.pool = SandboxPool(self.sandbox, uids) if c.pool and self.sandbox.isolated else None
        self._slots = _Slots(uids)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    @property
    def sandbox_uids(self) -> list[int]:
        """The uids untrusted programs run under (empty when the host is not root)."""
        return list(self.sandbox.uids)

    def reference(self, record: Mapping[str, Any], index: int) -> list[CodeTest]:
        return code_tests(record, index)

    def score_one(self, tests: list[CodeTest], completion: str) -> RewardResult:
        block = last_code_block(answer_region(completion))
        if block is None:
            return failed("format", reason="no fenced code block")
        lang, source = block
        if lang not in PYTHON_TAGS:
            return failed("format", reason=f"code block language {lang!r} is not Python")
        if self.pool is not None:
            with self.pool.worker(source) as worker:
                return self._run_tests(worker.run, tests)
        uid = self._slots.acquire()
        root = Path(tempfile.mkdtemp(prefix="vt-code-"))
        try:
            code_dir = prepare_code_dir(root, source)
            return self._run_tests(lambda mode, stdin, limits: self.sandbox.run(code_dir, mode, stdin, limits, uid), tests)
        finally:
            force_rmtree(root)
            self._slots.release(uid)

    def _run_tests(self, execute, tests: list) -> RewardResult:
        """``execute(mode, stdin, limits) -> RunResult``: one sandboxed run of the sample's solution."""
        c = self.config
        budget_end = time.monotonic() + c.problem_time_limit_s
        for j, test in enumerate(tests):
            left = budget_end - time.monotonic()
            if left <= 0:
                return failed("timeout", reason="problem time limit", tests_passed=j, tests_total=len(tests))
            wall = min(c.test_time_limit_s, left)
            limits = Limits(wall, c.memory_bytes, c.output_bytes, c.file_bytes, c.nproc, tmp_bytes=c.tmp_bytes)
            verdict = run_test(execute, test, limits)
            if verdict is not None:
                kind, info = verdict
                details = {"tests_passed": j, "tests_total": len(tests), "failed_test": j, **info}
                if kind == "verifier_error":
                    reason = details.pop("reason", "sandbox error")
                    return verifier_error(reason, **details)
                return failed(kind, **details)
        return passed(tests_passed=len(tests), tests_total=len(tests))


class _Slots:
    """Concurrency slots, each with its own sandbox uid (processes of two runs never share a uid)."""

    def __init__(self, uids: list):
        self._q: queue.Queue = queue.Queue()
        for u in uids:
            self._q.put(u)

    def acquire(self):
        return self._q.get()

    def release(self, uid) -> None:
        self._q.put(uid)
