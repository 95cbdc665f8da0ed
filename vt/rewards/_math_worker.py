"""Worker process for math-verify (run as ``python -m vt.rewards._math_worker [--memory-mb N]``).

Runs in its own process so the host can SIGKILL it at a deadline (see workers.py). Reads one JSON request
per line on stdin, writes one JSON reply per line on a private copy of stdout; fd 1 itself is pointed at
/dev/null so nothing sympy or math-verify prints can corrupt the protocol.

Request: {"gold": str, "pred": str | null, "timeout_s": int, "candidates"?: [str], "boxes"?: int}
         (gold and pred are LaTeX answer strings; see ``check``)
Reply:   {"verified": bool, "hedged"?: str, "gold_parsed": str, "pred_parsed": str}
      or {"gold_ok": true}  (pred null: the ground truth alone parsed)
      or {"error": "answer_timeout" | "answer_error": the answer's (a verdict: 0),
                   "timeout" | "gold_unparseable" | "exception": the verifier's or the data's,
                   "pred_unparseable", "message": str}
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


def _single_valued(expr) -> bool:
    """True when a parsed ground truth is one value (a number or an expression), not a set, tuple, interval,
    matrix, relation or text: only then can an answer that names several values be a hedge."""
    import sympy

    return isinstance(expr, sympy.Expr)


def check(gold: str, pred: str | None, timeout_s: int, candidates: list[str] | None = None, boxes: int = 1) -> dict:
    """math-verify's verdict with its default semantics (errors count as no match / no parse), with its internal
    timeouts reported, and answers that name several values judged as hedges.

    The ground truth is the data's: a timeout or error on it is the verifier's (the host makes it a verifier
    error). The answer is the sample's: whatever it makes math-verify do (a timeout, RecursionError, any
    exception) is an ``answer_timeout`` / ``answer_error`` reply, which the host scores 0, as math-verify's own
    verdict on a timeout is False. ``pred=None`` checks the ground truth alone (the host's probe after a worker
    missed its deadline: was it the answer?).

    ``candidates`` (the values the host found the answer to name: every different box split at "or", commas,
    line breaks, ..., an equation chain's last side and its plain numbers; None for one box naming one value) and
    ``boxes`` (how many different boxes) decide hedges. When the ground truth is a single value, every candidate
    must equal it (one math-verify cannot read equals nothing): some but not all is a hedge, none is wrong. Without candidates the answer gets
    math-verify's verdict as it is. Otherwise (a set, an interval, ...) the answer is compared whole, as
    math-verify does, and two different boxes are a hedge."""
    from math_verify import parse

    _TIMEOUTS.timeouts.clear()
    gold_p = parse(_wrap(gold), parsing_timeout=timeout_s)
    if _TIMEOUTS.timeouts:
        return {"error": "timeout", "message": "parsing the ground truth: " + _TIMEOUTS.timeouts[0]}
    if not gold_p:
        return {"error": "gold_unparseable", "message": _clip(f"math-verify extracted nothing from {gold!r}")}
    if pred is None:
        return {"gold_ok": True}
    try:
        return _check_answer(gold_p, pred, timeout_s, candidates, boxes)
    except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return {"error": "answer_error", "message": _clip(f"{type(e).__name__}: {e}")}


class _AnswerTimeout(Exception):
    pass


def _parse_answer(text: str, timeout_s: int, what: str) -> list:
    from math_verify import parse

    parsed = parse(_wrap(text), parsing_timeout=timeout_s)
    if _TIMEOUTS.timeouts:
        raise _AnswerTimeout(f"parsing the {what}: " + _TIMEOUTS.timeouts[0])
    return parsed


def _verify(gold_p: list, pred_p: list, timeout_s: int) -> bool:
    from math_verify import verify

    # Gold first: math-verify's comparison is not symmetric (e.g. intervals vs. sets).
    ok = verify(gold_p, pred_p, timeout_seconds=timeout_s)
    if _TIMEOUTS.timeouts:
        raise _AnswerTimeout("verify: " + _TIMEOUTS.timeouts[0])
    return bool(ok)


def _check_answer(gold_p: list, pred: str, timeout_s: int, candidates: list[str] | None, boxes: int) -> dict:
    try:
        pred_p = _parse_answer(pred, timeout_s, "answer")
        if not pred_p:
            return {"error": "pred_unparseable", "message": "math-verify extracted nothing"}
        # The string forms (index 1) are what the model wrote, normalised; never str() the sympy objects,
        # printing can itself hang on pathological expressions.
        shown = {"gold_parsed": _clip(str(gold_p[-1])), "pred_parsed": _clip(str(pred_p[-1]))}
        if not _single_valued(gold_p[0]):
            if boxes > 1:
                return {"verified": False, "hedged": f"{boxes} different boxed answers", **shown}
            return {"verified": _verify(gold_p, pred_p, timeout_s), **shown}
        if candidates is None:  # one value, as math-verify reads it
            return {"verified": _verify(gold_p, pred_p, timeout_s), **shown}
        values = [_parse_answer(c, timeout_s, "answer") for c in candidates]  # [] names something unreadable
        oks = [bool(v) and _verify(gold_p, v, timeout_s) for v in values]
        if all(oks):
            return {"verified": True, **shown}
        if any(oks):
            return {"verified": False, "hedged": f"the answer names {len(values)} values, not all equal", **shown}
        return {"verified": False, **shown}
    except _AnswerTimeout as e:
        return {"error": "answer_timeout", "message": _clip(str(e))}


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
            reply = check(req["gold"], req.get("pred"), int(req["timeout_s"]), req.get("candidates"),
                          int(req.get("boxes", 1)))
        except BaseException as e:  # noqa: BLE001 - math-verify's TimeoutException is a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            reply = {"error": "exception", "message": _clip(f"{type(e).__name__}: {e}")}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
