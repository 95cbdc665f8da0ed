"""Math reward: the last ``\\boxed{}`` of the answer, checked by math-verify in killable worker processes.

Pipeline per item (host side, cheap and bounded):
  1. the answer region: text after the last ``</think>``, then only its last ``tail_chars`` characters;
  2. every complete ``\\boxed{...}`` in it, by balanced-brace scan (``\\{``/``\\}`` are literal braces);
  3. the values the boxes name (``top_level_items``: split at "or", commas, ``\\lor``, ``\\\\``, ...);
  4. ``verify(gold, pred)`` (gold first) in a worker process with a hard deadline (workers.py), with the
     hedging policy below (the worker knows what the ground truth parses to).

Hedging policy (explicit, scores 0 with failure "format" and ``details["hedged"]``): an answer that names two
different values. When the ground truth is one value (a number or an expression), every value the answer names
must equal it: the values of every different box, each box split at top-level commas and semicolons, "or" /
"and" (words or ``\\text{ or }``), ``\\lor``, ``\\vee``, ``\\land``, ``\\cup``, ``\\quad``, line breaks
(``\\\\``, the rows of ``cases`` / ``aligned``), arrows and bars between values (``3 \\Rightarrow 5``, ``3 | 5``:
math-verify reads the last), and of an equation chain its last side and its plain numbers (``2 = 3`` names two
values, ``x = 3`` and ``6/2 = 3`` one). Some equal and some not is a hedge; the same value named twice
(``3 \\text{ or } 3``, ``6/2 = 3``, ``\\boxed{3} ... \\boxed{3}``) is not. When the ground truth is a set, tuple,
interval or relation, the answer is compared whole as math-verify compares it, and two different boxes are a
hedge.

Every answer gets a verdict: a check that times out on the answer (math-verify's own timeout, or the worker
killed at the deadline) is failure "timeout", one the answer makes raise or kill its worker "wrong", both 0, as
math-verify itself says False on a timeout. A verifier error (score None) is left for what the answer cannot
cause (``MathReward.verify``).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from vt.rewards.base import (RewardFunction, RewardResult, RewardSpecError, answer_region, clip, failed, field, passed,
                             verifier_error)
from vt.rewards.registry import MathConfig
from vt.rewards.workers import WorkerError, WorkerPool

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_answers(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in order (outermost boxes only).

    Linear time; an unbalanced box (a truncated generation, a million ``{``) is skipped, not an error.
    """
    out: list[str] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        end = _matching_brace(text, m.end())
        if end is None:
            pos = m.end()  # unbalanced: maybe a later box is complete
            continue
        out.append(text[m.end() : end])
        pos = end + 1


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` closing the group opened just before ``start``; None if it never closes."""
    depth = 1
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # \{ \} \\ are not grouping braces
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


_OPEN, _CLOSE = "([{", ")]}"
# Between two values of one answer: a comma or semicolon (not a thousands separator: "1,000"), a word or a \text
# group saying "or" / "and" ("3 \text{ or } 5", "3 \text{, } 5"), logical or set operators, a line break
# ("3 \\ 5", rows of cases / aligned), wide spaces.
_TEXT_SEPARATOR = (r"\\(?:text|textrm|textbf|textit|textsf|texttt|textup|textsc|textnormal|mathrm|mathbf|mathit|"
                   r"mathsf|mathtt|mbox|hbox|operatorname)\s*\{"
                   r"(?:[^{}]*\b(?:or|and|either|otherwise|alternatively)\b[^{}]*|[\s:()\[\]]*[,;][\s,;:()\[\]]*|\s*)\}")
# Between two values with no arithmetic between them, math-verify keeps the last ("3 \Rightarrow 5", "3 ~ 5",
# "3 \mid 5", "3 \hspace{1em} 5" all read as 5): arrows, relations that name no equation, wide spaces.
_JOINS = (r"\\(?:lor|vee|land|wedge|cup|quad|qquad|newline|cr|Rightarrow|Leftarrow|Longrightarrow|Longleftarrow|"
          r"implies|impliedby|iff|Leftrightarrow|Longleftrightarrow|leftrightarrow|rightarrow|leftarrow|"
          r"longrightarrow|to|gets|sim|mid|atop|enspace|thinspace|medspace|thickspace|enskip|qquad)(?![A-Za-z])"
          r"|\\hspace\*?\s*\{[^{}]*\}|\\[;:]|~")
_SEPARATOR_RE = re.compile(
    r"(?:" + _TEXT_SEPARATOR + r"|(?<!\d),|,(?!\d{3}(?!\d))|;|" + _JOINS +
    r"|\\\\(?:\s*\[[^\]]*\])?|\n|\bor\b|\band\b)(?:\s|\\ |~)*")
# "5 (or 3)", "5 (\text{or } 3)": an alternative in brackets is one more value.
_BRACKETED_ALTERNATIVE_RE = re.compile(
    r"[(\[]\s*(?:\\text[a-z]*\s*\{\s*(?:or|and|either|alternatively)\b([^{}]*)\}|(?:or|and|alternatively)\b)"
    r"([^()\[\]{}]*)[)\]]")
# A lone bar or an ellipsis with no operator beside it joins two values too ("3 | 5", "3 \dots 5"); two bars are an
# absolute value.
_DOTS_JOIN_RE = re.compile(r"(?<=[\w})])\s*\\(?:dots|ldots|dotsc)(?![A-Za-z])\s*(?=[\w\\{(])")
_THOUSANDS_RE = re.compile(r"^\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?$")
# Environments whose rows are alternatives: cases, aligned, ...; matrices are one value and stay whole.
_ROWS_ENV_RE = re.compile(r"\\(?:begin|end)\s*\{(?:cases|dcases|rcases|array|aligned|align\*?|alignat\*?|gathered|"
                          r"gather\*?|split|eqnarray\*?)\}(?:\s*\{[lcr|\s]*\})?")
# Words beside a number ("5, done", "5 \text{ or so}") name no value when the ground truth is a number; a digit or a
# number's name ("\text{3}", "three") does.
_WORDS_RE = re.compile(r"^(?:\\text\s*\{[^{}\d]*\}|[A-Za-z.\s]*[A-Za-z]{2,}[A-Za-z.\s]*)$")
_NUMBER_WORDS_RE = re.compile(
    r"\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
    r"seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|"
    r"billion|half|halves|third|quarter|inf|infinity|infinite|pi|none|no|yes)\b", re.I)


def top_level_items(answer: str) -> list[str]:
    r"""Split an answer into the values it names, at separators outside brackets: commas and semicolons, "or" /
    "and" (as words or in ``\text{}``), ``\lor``, ``\vee``, ``\cup``, ``\quad``, line breaks (``\\``,
    ``\begin{cases}`` rows). ``(1, 2)``, ``\{1, 2\}``, ``f(1, 2)`` and ``1,000`` stay one item; an answer wrapped
    whole in brackets, ``(3 \lor 5)``, is split inside at everything but commas (the brackets' own).
    Linear in the answer's length, never recursive: a hostile box costs the host about a millisecond."""
    s = _ROWS_ENV_RE.sub(" \\\\\\\\ ", answer).replace("&", " ")
    s = _BRACKETED_ALTERNATIVE_RE.sub(lambda m: " \\text{ or } " + (m.group(1) or "") + m.group(2), s)
    s = re.sub(r"(?<!\\)\\ ", " ", s).strip()  # "\ " is a space
    s = _DOTS_JOIN_RE.sub(lambda m: " \\lor ", s)
    bars = re.findall(r"\\vert(?![A-Za-z])|\|", s)
    if len(bars) == 1 and "\\left" not in s:
        s = s.replace(bars[0], " \\mid ")
    if _THOUSANDS_RE.match(s):  # "1,000" is a number; "469, 468" (with a space) is a list
        return [s]
    items = _split(s, commas=True)
    if len(items) == 1:  # wrapped whole in brackets, however deep: split inside, commas excepted
        inside = _split(_unwrapped(items[0]), commas=False)
        if len(inside) > 1:
            items = inside
    return items


_COMMAND_RE = re.compile(r"\\(?:[A-Za-z]+|.)", re.S)


def _split(s: str, commas: bool) -> list[str]:
    """``s`` cut at the separators outside brackets (commas and semicolons only if ``commas``)."""
    items, depth, last, i, n = [], 0, 0, 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and (c == "\n" or not c.isspace()):
            m = _SEPARATOR_RE.match(s, i)
            if m and (commas or m.group().strip() not in (",", ";")):
                if s[last:i].strip():
                    items.append(s[last:i].strip())
                last = i = m.end()
                continue
            if c == "\\":  # a command's name is not a word "or" / "and" ("\land" is matched above), "\," no comma
                m = _COMMAND_RE.match(s, i)
                i = m.end() if m else i + 1
                continue
        i += 1
    if s[last:].strip():
        items.append(s[last:].strip())
    return items


def _unwrapped(item: str) -> str:
    """``item`` without the brackets that wrap the whole of it (``((3 \\lor 5))`` -> ``3 \\lor 5``), in one pass."""
    s = item.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    close_of, stack, i = {}, [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2  # \{ \} and escaped characters are not grouping
            continue
        if c in _OPEN:
            stack.append(i)
        elif c in _CLOSE and stack:
            close_of[stack.pop()] = i
        i += 1
    start, end = 0, len(s) - 1
    while start < end and close_of.get(start) == end:
        start, end = start + 1, end - 1
        while start < end and s[start].isspace():
            start += 1
        while start < end and s[end].isspace():
            end -= 1
    return s[start : end + 1]


_PLAIN_NUMBER_RE = re.compile(r"\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)\s*")


def equation_values(item: str) -> list[str]:
    """The values an equation chain names: its last side, and each other side that is a plain number. ``2 = 3``
    names two; ``x = 3``, ``6/2 = 3`` and ``1 + 2 + \\dots + 10 = 55`` one (a name or a computation is not a
    value; math-verify reads the last side). Not an equation: the item itself."""
    item = re.sub(r"\\equiv(?![A-Za-z])", "=", item)  # math-verify reads it as an equation too
    sides, depth, last = [], 0, 0
    for i, c in enumerate(item):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif c == "=" and depth == 0 and item[i - 1 : i] not in ("<", ">", "!", ":", "=") and item[i + 1 : i + 2] != "=":
            sides.append(item[last:i])
            last = i + 1
    if not sides:
        return [item]
    sides.append(item[last:])
    return [x.strip() for x in sides[:-1] if _PLAIN_NUMBER_RE.fullmatch(x)] + [sides[-1].strip()]


# The answer's name before its value ("x \to 3", "f(x) \sim x^2", "\theta \Rightarrow \frac{\pi}{4}"): a letter or a
# Greek letter (not \pi), a subscript, primes, an argument list.
_NAME_RE = re.compile(r"^(?:[A-Za-z]|\\(?:alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|"
                      r"lambda|mu|nu|xi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|"
                      r"Sigma|Phi|Psi|Omega)(?![A-Za-z]))(?:_(?:\{[^{}]*\}|\w))?'*(?:\s*\([^()]*\))?$")


def hedge_candidates(boxes: list[str], gold: str = "") -> tuple[list[str], list[str] | None]:
    """(the distinct boxed answers, in order, ignoring whitespace; the values they name, box by box, or None when
    they name one value, which math-verify then reads as the answer is written). Left out: a name before the
    values (``x`` of ``x \\to 3``), and, with a ground truth that holds a digit, items that are only words
    ("5, done"): they name no number."""
    distinct = list({re.sub(r"\s+", "", b): b for b in boxes}.values())
    values = [v for b in distinct for item in top_level_items(b) for v in equation_values(item)]
    if len(values) > 1 and _NAME_RE.match(values[0]):
        values = values[1:]
    if re.search(r"\d", gold):
        values = [v for v in values if not (_WORDS_RE.match(v) and not _NUMBER_WORDS_RE.search(v))] or values[-1:]
    return distinct, (values if len(distinct) > 1 or len(values) > 1 else None)


def ground_truth_text(value: Any, index: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RewardSpecError(
            f"record {index}: field 'ground_truth' must be an int, float or string, got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):  # a parquet NaN: no answer equals it
        raise RewardSpecError(f"record {index}: field 'ground_truth' is {value}, not a finite number")
    text = str(value).strip()
    if not text:
        raise RewardSpecError(f"record {index}: field 'ground_truth' is empty")
    return text


class MathReward(RewardFunction):
    """1 if the last boxed answer equals the ground truth under math-verify, else 0 (or a verifier error)."""

    domain = "math"
    streams = True  # score_batch maps score_one over the items

    def __init__(self, config: MathConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or MathConfig(), **overrides)
        args = ["--memory-mb", str(self.config.worker_memory_mb)]
        self.pool = WorkerPool("vt.rewards._math_worker", self.config.workers, self.config.startup_timeout_s, args)

    def reference(self, record: Mapping[str, Any], index: int) -> str:
        return ground_truth_text(field(record, "ground_truth", index), index)

    def score_one(self, gold: str, completion: str) -> RewardResult:
        boxes = boxed_answers(answer_region(completion, self.config.tail_chars))
        if not boxes:
            return failed("format", reason="no complete \\boxed{} in the answer region")
        return self.verify(gold, boxes[-1], boxes)

    def verify(self, gold: str, answer: str, boxes: list[str] | None = None) -> RewardResult:
        """math-verify on one (gold, predicted answer) pair in a worker, with the hard deadline; ``boxes`` (every
        box of the answer region, ``answer`` the last) for the hedging policy (module docstring).

        Whatever the answer makes the check do ends in a verdict: a timeout (math-verify's own, or the worker
        killed at the deadline) is failure "timeout", an exception or a crashed worker "wrong", both 0. A
        verifier error (None) is left for what the answer cannot cause: a ground truth that does not parse or
        times out, workers that cannot start, a deadline missed on the ground truth alone."""
        distinct, candidates = hedge_candidates(boxes or [answer], gold)
        request: dict[str, Any] = {"gold": gold, "pred": answer, "timeout_s": self.config.verify_timeout_s}
        if candidates is not None:
            request.update(candidates=candidates, boxes=len(distinct))
        shown = clip(answer)
        try:
            reply = self.pool.call(request, self.config.deadline_s)
        except WorkerError as e:
            return self._after_worker_error(e, request, shown)
        return self._verdict(reply, gold, shown)

    @staticmethod
    def _verdict(reply: dict, gold: str, shown: str) -> RewardResult:
        error = reply.get("error")
        if error == "pred_unparseable":
            return failed("format", reason="math-verify could not parse the answer", answer=shown)
        if error == "answer_timeout":
            return failed("timeout", reason=clip(f"math-verify timed out on the answer ({reply.get('message', '')})"),
                          answer=shown)
        if error == "answer_error":
            return failed("wrong", reason=clip(f"math-verify failed on the answer: {reply.get('message', '')}"),
                          answer=shown)
        if error is not None:  # the ground truth's timeout, gold_unparseable, exception: correctness unknown
            return verifier_error(f"{error}: {reply.get('message', '')}", answer=shown)
        details = {"answer": reply.get("pred_parsed", shown), "ground_truth": reply.get("gold_parsed", gold)}
        if reply.get("hedged"):
            return failed("format", reason=str(reply["hedged"]), hedged=True, **details)
        return passed(**details) if reply.get("verified") is True else failed("wrong", **details)

    def _after_worker_error(self, error: WorkerError, request: dict, shown: str) -> RewardResult:
        """A worker that missed the deadline or died on this request. The ground truth alone is checked in a
        fresh worker: if that fails too, the verifier cannot run on this record (a verifier error); else the
        answer did it: a deadline is a timeout (0), a worker that died on the request twice a wrong answer (0)."""
        if error.kind not in ("deadline", "died"):  # start-up failed, garbage replies: the verifier's
            return verifier_error(str(error), answer=shown, deadline_s=self.config.deadline_s)
        if error.kind == "died":  # maybe not the answer's doing (a kill from outside): once more
            try:
                return self._verdict(self.pool.call(request, self.config.deadline_s), request["gold"], shown)
            except WorkerError as again:
                error = again
        try:
            probe = self.pool.call({"gold": request["gold"], "pred": None, "timeout_s": request["timeout_s"]},
                                   self.config.deadline_s)
        except WorkerError as e:
            return verifier_error(f"{error}; the ground truth alone: {e}", answer=shown)
        if not probe.get("gold_ok"):
            return verifier_error(f"{error}; the ground truth alone: {probe.get('error')}: "
                                  f"{probe.get('message', '')}", answer=shown)
        if error.kind == "deadline":
            return failed("timeout", reason=f"the check of the answer ran past its {self.config.deadline_s:g} s "
                                            "deadline", answer=shown)
        return failed("wrong", reason=f"the check of the answer killed its worker ({error})", answer=shown)

    def close(self) -> None:
        self.pool.close()
