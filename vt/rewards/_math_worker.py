"""Worker process for math-verify (run as ``python -m vt.rewards._math_worker [--memory-mb N]``).

Runs in its own process so the host can SIGKILL it at a deadline (see workers.py). Reads one JSON request
per line on stdin, writes one JSON reply per line on a private copy of stdout; fd 1 itself is pointed at
/dev/null so nothing sympy or math-verify prints can corrupt the protocol.

Request: {"gold": str, "pred": str, "timeout_s": int}  (gold and pred are LaTeX answer strings)
Reply:   {"verified": bool, "gold_parsed": str, "pred_parsed": str}
      or {"error": "gold_unparseable" | "pred_unparseable" | "exception", "message": str}
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys


def _wrap(answer: str) -> str:
    """LaTeX answer text -> a string math-verify extracts reliably: ``\\boxed{...}`` (no $ needed)."""
    a = answer.strip()
    if "\\boxed" in a:
        return a
    if len(a) >= 2 and a[0] == a[-1] == "$":
        a = a.strip("$")
    return "\\boxed{" + a + "}"


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]


class _TimeoutLog(logging.Handler):
    """Records math-verify's own timeouts, which it otherwise only logs (and then answers False / [])."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.timeouts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "timeout" in msg.lower() or "timed out" in msg.lower():
            self.timeouts.append(_clip(msg))


_TIMEOUTS = _TimeoutLog()


def check(gold: str, pred: str, timeout_s: int) -> dict:
    """math-verify's verdict with its default semantics (errors count as no match / no parse), except
    that any of its internal timeouts is reported: a timeout means "unknown", not "wrong"."""
    from math_verify import parse, verify

    _TIMEOUTS.timeouts.clear()
    gold_p = parse(_wrap(gold), parsing_timeout=timeout_s)
    if _TIMEOUTS.timeouts:
        return {"error": "timeout", "message": "parsing the ground truth: " + _TIMEOUTS.timeouts[0]}
    if not gold_p:
        return {"error": "gold_unparseable", "message": _clip(f"math-verify extracted nothing from {gold!r}")}
    pred_p = parse(_wrap(pred), parsing_timeout=timeout_s)
    if _TIMEOUTS.timeouts:
        return {"error": "timeout", "message": "parsing the answer: " + _TIMEOUTS.timeouts[0]}
    if not pred_p:
        return {"error": "pred_unparseable", "message": "math-verify extracted nothing"}
    # Gold first: math-verify's comparison is not symmetric (e.g. intervals vs. sets).
    ok = verify(gold_p, pred_p, timeout_seconds=timeout_s)
    if _TIMEOUTS.timeouts:
        return {"error": "timeout", "message": "verify: " + _TIMEOUTS.timeouts[0]}
    # The string forms (index 1) are what the model wrote, normalised; never str() the sympy objects,
    # printing can itself hang on pathological expressions.
    return {"verified": bool(ok), "gold_parsed": _clip(str(gold_p[-1])), "pred_parsed": _clip(str(pred_p[-1]))}


def _cpu_backstop(budget_s: int) -> None:
    """If the host dies while we are stuck in C code, the kernel ends us after ``budget_s`` CPU seconds."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    now = int(used.ru_utime + used.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = now + budget_s
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--memory-mb", type=int, default=0, help="address-space cap; 0 = none")
    args = ap.parse_args()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = sys.stderr
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if args.memory_mb:
        # A tower like 10^{10^{10}} makes sympy try to build a 10-billion-digit integer.
        cap = args.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    mv_log = logging.getLogger("math_verify")
    mv_log.setLevel(logging.WARNING)
    mv_log.addHandler(_TIMEOUTS)
    mv_log.propagate = False  # stderr is /dev/null anyway; keep the formatting work away too
    import math_verify  # noqa: F401 - import before "ready" so start-up never counts against a deadline

    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        _cpu_backstop(4 * int(req["timeout_s"]) + 5)
        try:
            reply = check(req["gold"], req["pred"], int(req["timeout_s"]))
        except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            reply = {"error": "exception", "message": _clip(f"{type(e).__name__}: {e}")}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
