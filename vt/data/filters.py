"""Quality filters: n-gram repetition (degenerate, looping traces) and 13-gram decontamination.

Both work on normalised words: lower-cased, split on anything that is not a letter or digit, so
formatting (LaTeX spacing, punctuation, markdown) does not hide a match.

Repetition: ``repetition_score(text, n) = 1 - distinct_ngrams / total_ngrams`` over word n-grams, in
[0, 1): 0 for text with no repeated n-gram, close to 1 for a loop ("the the the ..."). A trace is rejected
when the score is above a threshold (e.g. 0.5 for n = 10 flags a model that repeats whole sentences).

Decontamination (GPT-3 / Llama style): a training text is contaminated when it shares any word 13-gram
with an evaluation text. Eval texts shorter than 13 words (but at least ``min_short_words``) are matched
as a whole word sequence instead, so a short eval question copied verbatim still counts; shorter ones are
ignored (they would flag common phrases).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def repetition_score(text: str, n: int = 10) -> float:
    """``1 - distinct/total`` word n-grams (0 when the text has fewer than n words)."""
    grams = ngrams(words(text), n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


class NgramDecontaminator:
    """Index evaluation texts once; ``is_contaminated(text)`` / ``matches(text)`` for training texts."""

    def __init__(self, eval_texts: Iterable[str], n: int = 13, min_short_words: int = 6):
        self.n = n
        self._grams: set[tuple[str, ...]] = set()
        self._short: set[tuple[str, ...]] = set()
        for t in eval_texts:
            w = words(t)
            if len(w) < n:
                if len(w) >= min_short_words:
                    self._short.add(tuple(w))
            else:
                self._grams.update(ngrams(w, n))

    def matches(self, text: str) -> list[tuple[str, ...]]:
        """The eval n-grams (or whole short eval texts) found in ``text``."""
        w = words(text)
        found = [g for g in ngrams(w, self.n) if g in self._grams]
        if self._short:
            joined = " " + " ".join(w) + " "
            found += [s for s in self._short if " " + " ".join(s) + " " in joined]
        return found

    def is_contaminated(self, text: str) -> bool:
        return bool(self.matches(text))
