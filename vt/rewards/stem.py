"""STEM reward: multiple-choice option matching and numeric answers with tolerance.

The ground truth decides the mode:
  - a single option letter A-J (``"C"``, ``"(C)"``): the completion's chosen option must match. The choice
    is read from the answer region, first hit wins: its ``\\boxed{...}`` (``\\boxed{C}``,
    ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``, ``\\boxed{C. 42 m}``), then the last "answer: C" /
    "answer is (C)" phrase, then a region that is just an option (``"(B)"``, ``"B."``). Naming several
    options is a hedge: 0, failure "format" (``\\boxed{A, C}``, ``\\boxed{A} ... \\boxed{C}``, "the answer
    is A or C", "Answer: (A) (C)"); a later phrase replaces an earlier one ("B, no wait. Answer: D");
  - a number (``"9.81"``, ``"-3e-5"``, ``"\\frac{1}{3}"``): every boxed answer (else the last "answer:"
    phrase and the numbers it joins with "or", ",", ";") split into the values it names as the math reward
    splits them (``10 \\text{ or } 20``, ``10 = 20``, rows; of an equation chain the last side and the plain
    numbers: ``g = 9.81`` names one), each parsed as a number (decimals, scientific notation,
    ``\\times 10^{k}``, simple fractions, a percent sign is a unit; trailing units ignored, but a second
    number beside the first, "10 - 20", makes it no number; ``\\pm`` is an uncertainty around it), must satisfy
    ``|pred - gold| <= max(abs_tol, rel_tol * |gold|)``: all of them is right, some a hedge, none wrong;
  - anything else (an expression): delegated to the math reward (math-verify in worker processes).
"""
from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Mapping
from typing import Any

from vt.rewards.base import RewardFunction, RewardResult, answer_region, clip, failed, field, passed
from vt.rewards.math_reward import MathReward, boxed_answers, equation_values, ground_truth_text, top_level_items
from vt.rewards.registry import MathConfig, StemConfig

OPTIONS = "ABCDEFGHIJ"
_OPTION_ONLY_RE = re.compile(r"^\s*[\(\[]?\s*([A-J])\s*[\)\]]?\s*[.:]?\s*$")
_OPTION_LEAD_RE = re.compile(r"^\s*(?:\\text\{\s*)?[\(\[]?\s*([A-J])\s*[\)\]]?(?:\s*\})?(?:[.:)\s]|$)")
_ANSWER_PHRASE_RE = re.compile(
    r"answer\s*(?:is|:)?\s*(?:\*\*)?\s*[:=]?\s*(?:option\s*)?[\(\[]?\s*(\\boxed\{[^}]*\}|[A-J])\s*[\)\]]?(?![A-Za-z])",
    re.IGNORECASE,
)
_NUMBER_PHRASE_RE = re.compile(
    r"answer\s*(?:is|:)\s*(?:\*\*)?\s*[:=]?\s*([-+−]?[\d.,]+(?:\s*(?:[eE]|\\times\s*10\^)\s*\{?[-+−]?\d+\}?)?)", re.I
)


def option_letter(text: str) -> str | None:
    """'C', '(C)', '[C]', 'C.' -> 'C'; anything else None."""
    m = _OPTION_ONLY_RE.match(text.replace("\\text{", "").replace("}", "") if "\\text{" in text else text)
    return m.group(1) if m else None


# After an "answer is C" phrase: another option joined to it ("C or A", "C, A", "(C) (A)", "C and D"); a bare "I"
# followed by a word is the pronoun ("C and I think ..."), not option I.
_JOIN = (r"(?:\s*(?:,|;|/|&|\||\bor\b|\band\b|\\lor\b|\\vee\b|\.\s*(?=or\b)))+\s*"
         r"(?:(?:maybe|possibly|perhaps|rather|alternatively|else|either|option|\*\*)\s*)*")
# A joined option ends the statement (end, punctuation, another join): in "B, and A is wrong" A is not chosen.
_ENDS = r"(?=\s*(?:\*\*)?\s*(?:$|[.,;:!?)\]/|&*\n]|\bor\b|\band\b))"
_MORE_OPTIONS_RE = re.compile(
    r"(?:\*\*)?(?:" + _JOIN + r"(?:[\(\[]\s*(?-i:[A-J])\s*[\)\]]|(?-i:[A-J])(?![A-Za-z]))"
    r"|\s+[\(\[]\s*(?-i:[A-J])\s*[\)\]]|\s*[\(\[]\s*(?:or|and)\s+(?:option\s*)?(?-i:[A-J])\s*[\)\]])" + _ENDS,
    re.IGNORECASE)


def _box_options(box: str) -> list[str]:
    box = box.strip()
    letters = re.findall(r"(?<![A-Za-z\\])([A-J])(?![A-Za-z])", box)
    lead = _OPTION_LEAD_RE.match(box)
    if lead and len(set(letters)) <= 1:
        return [lead.group(1)]
    return sorted(set(letters))


def chosen_options(region: str) -> list[str]:
    """The option(s) the answer region commits to, by the precedence in the module docstring: every box counts
    (``\\boxed{A} ... \\boxed{C}`` chooses two), an answer phrase with the options it joins ("A or C")."""
    boxes = boxed_answers(region)
    if boxes:
        return sorted({o for box in boxes for o in _box_options(box)})
    phrases = list(_ANSWER_PHRASE_RE.finditer(region))
    if phrases:
        last = phrases[-1]
        if last.group(1).startswith("\\boxed"):
            return chosen_options(last.group(1))
        chosen, pos = {last.group(1).upper()}, last.end()
        while m := _MORE_OPTIONS_RE.match(region, pos):
            chosen.add(re.findall(r"[A-J]", m.group())[-1])  # the option is the match's last capital A-J
            pos = m.end()
        return sorted(chosen)
    letter = option_letter(region)
    return [letter] if letter else []


_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"


_MORE_NUMBERS_RE = re.compile(
    r"(?:\s*[A-Za-zµΩ°%/^]{1,6})?(?:" + _JOIN + r"|\s*[\(\[]\s*(?:or|and)\s+)"
    r"([-+−]?\d[\d.]*(?:\s*(?:[eE]|\\times\s*10\^)\s*\{?[-+−]?\d+\}?)?)"
    r"(?=\s*(?:[A-Za-zµΩ°%/^]{1,6}\s*)?(?:$|[.,;:!?)\]\n]|\bor\b|\band\b))", re.I)


def _number_values(text: str) -> list[float]:
    """The finite numbers an answer item names (vt.rewards.math_reward.equation_values: "2 = 3" names two;
    "v = 9.8" and "2 \\times 5 = 10" one)."""
    values = (parse_number(v) for v in equation_values(text))
    return [v for v in values if v is not None and math.isfinite(v)]


def parse_number(text: str) -> float | None:
    """A number from a short answer string; None if it is not one."""
    s = text.strip().replace("−", "-").replace("$", "").replace("\\!", "").replace("\\,", "").replace("{,}", "")
    s = re.sub(r"\\(?:text|mathrm|mbox)\{[^}]*\}", " ", s)  # units
    s = s.replace("\\left", "").replace("\\right", "").replace("\\cdot", "\\times").strip()
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s.split()[0] if s.split() else ""):
        s = s.replace(",", "", s.count(","))
    m = re.fullmatch(rf"([-+]?)\\[dt]?frac\{{\s*({_NUM})\s*\}}\{{\s*({_NUM})\s*\}}.*", s)
    if m:
        den = float(m.group(3))
        return None if den == 0 else (-1 if m.group(1) == "-" else 1) * float(m.group(2)) / den
    m = re.fullmatch(rf"({_NUM})\s*/\s*({_NUM})", s)
    if m:
        den = float(m.group(2))
        return None if den == 0 else float(m.group(1)) / den
    m = re.match(rf"({_NUM})(?:\s*(?:[eE]\s*([-+]?\d+)|\\times\s*10\s*\^\s*\{{?\s*([-+]?\d+)\s*\}}?))?", s)
    if not m or m.end() == 0:
        return None
    rest = s[m.end() :].strip()
    if rest and not re.fullmatch(r"[A-Za-z°µΩ%/\^\-\d\s\\{}.*]*", rest):
        return None  # "3 + x" is not a number
    rest = re.sub(r"\\pm\s*[\d.]+", " ", rest)  # an uncertainty ("9.81 \\pm 0.01"): the value is the centre
    if re.search(r"(?<![\^{\w.\-])-?\d", rest):
        return None  # another number beside it ("10 - 20", "10 \\approx 20"): digits only in a unit's power
    exp = m.group(2) or m.group(3)
    return float(f"{m.group(1)}e{int(exp)}" if exp else m.group(1))  # one rounding, not mantissa * 10**k


class StemReward(RewardFunction):
    domain = "stem"
    streams = True  # score_batch maps score_one over the items

    def __init__(self, config: StemConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or StemConfig(), **overrides)
        self._math: MathReward | None = None  # started only if an expression-valued answer shows up
        self._math_lock = threading.Lock()

    def reference(self, record: Mapping[str, Any], index: int) -> str:
        return ground_truth_text(field(record, "ground_truth", index), index)

    def score_one(self, gold: str, completion: str) -> RewardResult:
        region = answer_region(completion, self.config.tail_chars)
        letter = option_letter(gold)
        if letter is not None:
            return self._score_option(letter, region)
        value = parse_number(gold)
        if value is not None and math.isfinite(value):
            return self._score_number(value, region)
        return self._math_reward().score_one(gold, completion)

    def _score_option(self, gold: str, region: str) -> RewardResult:
        chosen = chosen_options(region)
        if not chosen:
            return failed("format", reason="no option found")
        if len(chosen) > 1:
            return failed("format", reason=f"several options chosen: {chosen}", hedged=True)
        details = {"answer": chosen[0], "ground_truth": gold}
        return passed(**details) if chosen[0] == gold else failed("wrong", **details)

    def _score_number(self, gold: float, region: str) -> RewardResult:
        boxes = boxed_answers(region)
        if boxes:  # every different box, each split into the values it names ("10 \\text{ or } 20", "2 = 3")
            distinct = list({re.sub(r"\s+", "", b): b for b in boxes}.values())
            texts = [item for b in distinct for item in top_level_items(b)]
        else:
            phrases = list(_NUMBER_PHRASE_RE.finditer(region))
            if not phrases:
                return failed("format", reason="no boxed or stated answer")
            first = phrases[-1].group(1).rstrip(".,")  # "is 10, so": not "10,"
            texts, pos = [first], phrases[-1].start(1) + len(first)
            while m := _MORE_NUMBERS_RE.match(region, pos):  # "the answer is 10 or 20"
                texts.append(m.group(1))
                pos = m.end()
        values = [v for t in texts for v in _number_values(t)]
        if not values:
            return failed("format", reason="answer is not a number", answer=clip(texts[-1] if texts else boxes[-1]))
        oks = [abs(v - gold) <= max(self.config.abs_tol, self.config.rel_tol * abs(gold)) for v in values]
        details = {"answer": values[-1], "ground_truth": gold}
        if len(set(oks)) > 1:
            return failed("format", reason=f"the answer names {len(values)} values, not all equal", hedged=True,
                          **details)
        return passed(**details) if all(oks) else failed("wrong", **details)
    def _math_reward(self) -> MathReward:
        with self._math_lock:
            if self._math is None:
                c = self.config
                self._math = MathReward(MathConfig(c.workers, c.deadline_s, tail_chars=c.tail_chars))
            return self._math

    def close(self) -> None:
        if self._math is not None:
            self._math.close()
