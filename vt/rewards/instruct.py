"""Instruction-following reward: rule-based constraint checkers in the spirit of IFEval's 25 types.

A prompt carries its constraints as data, e.g.
    [{"type": "length_words", "relation": "at least", "num": 100}, {"type": "no_commas"}]
Each type is a small registered frozen dataclass whose fields are its keyword arguments; unknown types,
missing, unknown or mistyped arguments raise ``RewardSpecError`` naming the record and field.
``from_ifeval`` converts IFEval's ``instruction_id_list`` + ``kwargs`` to this form.

The reward is the fraction of constraints met (partial credit). Strict: the response as is. Loose (as
IFEval): a constraint counts as met if any of the response, the response without its first line, without
its last line, without both, and each of those with markdown ``*`` removed, satisfies it. Both are in the
details; ``mode`` picks the score. Everything is offline: no nltk data, regex tokenisation only.
"""
from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from vt.rewards.base import RewardFunction, RewardResult, RewardSpecError, field, passed

RELATIONS = ("less than", "at most", "exactly", "at least", "more than")


def compare(value: int, relation: str, num: int) -> bool:
    return {
        "less than": value < num,
        "at most": value <= num,
        "exactly": value == num,
        "at least": value >= num,
        "more than": value > num,
    }[relation]


# ---- text helpers (regex only, linear time) ----------------------------------------------------

_WORD_RE = re.compile(r"\w+", re.UNICODE)  # IFEval counts words with nltk's RegexpTokenizer(r"\w+")
_ABBREVIATIONS = ("Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Jr", "Sr", "vs", r"e\.g", r"i\.e", "etc")
_ABBREV = "".join(rf"(?<!\b{a})" for a in _ABBREVIATIONS)  # a period after these does not end a sentence
_SENTENCE_END_RE = re.compile(_ABBREV + r"(?<!\b[A-Z])[.!?]+[\"')\]]*(?=\s+|$)")


def count_words(text: str) -> int:
    return len(_WORD_RE.findall(text))


def count_sentences(text: str) -> int:
    """Sentences ended by . ! ? (not after common abbreviations or single initials); a trailing
    unterminated fragment counts as a sentence."""
    count, last = 0, 0
    for m in _SENTENCE_END_RE.finditer(text):
        if _WORD_RE.search(text, last, m.start()):
            count += 1
        last = m.end()
    if _WORD_RE.search(text, last):
        count += 1
    return count


def paragraphs_by_stars(text: str) -> list[str]:
    return re.split(r"\s?\*\*\*\s?", text)


def paragraphs_by_blank_lines(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


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
    keywords: list

    def check(self, response):
        return all(re.search(re.escape(k), response, re.IGNORECASE) for k in self.keywords)


@register("keywords_absent", "keywords:forbidden_words", {"forbidden_words": "keywords"})
class KeywordsAbsent(Constraint):
    keywords: list

    def check(self, response):
        return not any(re.search(r"\b" + re.escape(k) + r"\b", response, re.IGNORECASE) for k in self.keywords)


@register("keyword_frequency", "keywords:frequency", {"keyword": "keyword", "relation": "relation", "frequency": "num"})
class KeywordFrequency(Constraint):
    keyword: str
    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        return compare(len(re.findall(re.escape(self.keyword), response, re.IGNORECASE)), self.relation, self.num)


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
        if len(self.letter) != 1 or not self.letter.isalpha():
            raise ValueError(f"'letter' must be a single letter, got {self.letter!r}")

    def check(self, response):
        return compare(response.lower().count(self.letter.lower()), self.relation, self.num)


@register("language", "language:response_language", {"language": "language"})
class Language(Constraint):
    language: str

    def validate(self):
        if self.language not in SCRIPT_LANGUAGES and self.language not in LATIN_STOPWORDS:
            supported = sorted(set(SCRIPT_LANGUAGES) | set(LATIN_STOPWORDS))
            raise ValueError(f"'language' {self.language!r} cannot be checked offline; supported: {supported}")

    def check(self, response):
        return detect_language(response) == self.language


@register("length_sentences", "length_constraints:number_sentences", {"relation": "relation", "num_sentences": "num"})
class LengthSentences(Constraint):
    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        return compare(count_sentences(response), self.relation, self.num)


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
        parts = paragraphs_by_stars(response)
        inner = parts[1:-1]
        if any(not p.strip() for p in inner):
            return False
        return len([p for p in parts if p.strip()]) == self.num


@register(
    "nth_paragraph_first_word",
    "length_constraints:nth_paragraph_first_word",
    {"num_paragraphs": "num_paragraphs", "nth_paragraph": "nth", "first_word": "first_word"},
)
class NthParagraphFirstWord(Constraint):
    """Exactly ``num_paragraphs`` paragraphs (blank-line separated); the ``nth`` (1-based) starts with
    ``first_word``."""

    num_paragraphs: int
    nth: int
    first_word: str

    def validate(self):
        if not 1 <= self.nth <= self.num_paragraphs:
            raise ValueError(f"'nth' must be in 1..num_paragraphs, got {self.nth}")

    def check(self, response):
        paras = paragraphs_by_blank_lines(response)
        if len(paras) != self.num_paragraphs:
            return False
        words = _WORD_RE.findall(paras[self.nth - 1])
        return bool(words) and words[0].lower() == self.first_word.lower()


@register("placeholders", "detectable_content:number_placeholders", {"num_placeholders": "num"})
class Placeholders(Constraint):
    """At least ``num`` placeholders in square brackets, like [address]."""

    num: int

    def check(self, response):
        return len(re.findall(r"\[[^\[\]\n]+\]", response)) >= self.num


@register("postscript", "detectable_content:postscript", {"postscript_marker": "marker"})
class Postscript(Constraint):
    marker: str = "P.S."

    def check(self, response):
        if self.marker.upper() == "P.P.S":
            pattern = r"\s*p\.\s?p\.\s?s.*$"
        elif self.marker.upper() == "P.S.":
            pattern = r"\s*p\.\s?s\..*$"
        else:
            pattern = r"\s*" + re.escape(self.marker.lower()) + r".*$"
        return bool(re.search(pattern, response.lower(), re.MULTILINE))


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
    """At least ``num`` sections headed ``<splitter> <number>`` (e.g. "Section 1")."""

    num: int
    splitter: str = "Section"

    def check(self, response):
        parts = re.split(r"\s?" + re.escape(self.splitter) + r"\s?\d+\s?", response)
        return len(parts) - 1 >= self.num


@register("json_format", "detectable_format:json_format", {})
class JsonFormat(Constraint):
    """The whole response is JSON (optionally inside a ``` / ```json fence)."""

    def check(self, response):
        text = response.strip()
        text = re.sub(r"^```(?:json|Json|JSON)?\s*", "", text)
        text = re.sub(r"\s*```$", "", text).strip()
        try:
            json.loads(text)
        except (ValueError, RecursionError):  # "[[[[..." nests past the decoder's recursion limit
            return False
        return True


@register("title", "detectable_format:title", {})
class Title(Constraint):
    """A title wrapped in double angular brackets, like <<poem of joy>>."""

    def check(self, response):
        return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", response))


@register("two_responses", "combination:two_responses", {})
class TwoResponses(Constraint):
    """Two different responses separated by six asterisks ``******``."""

    def check(self, response):
        parts = response.split("******")
        nonempty = [p.strip() for p in parts if p.strip()]
        blanks_inside = any(not p.strip() for p in parts[1:-1])
        return len(nonempty) == 2 and not blanks_inside and nonempty[0] != nonempty[1]


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
    """Words written in ALL CAPITALS: their count compared with ``num``."""

    relation: str
    num: int

    def validate(self):
        _check_relation(self.relation)

    def check(self, response):
        words = _WORD_RE.findall(response)
        return compare(sum(1 for w in words if w.isupper()), self.relation, self.num)


@register("all_uppercase", "change_case:english_capital", {})
class AllUppercase(Constraint):
    def check(self, response):
        return response.isupper()


@register("all_lowercase", "change_case:english_lowercase", {})
class AllLowercase(Constraint):
    def check(self, response):
        return response.islower()


@register("no_commas", "punctuation:no_comma", {})
class NoCommas(Constraint):
    def check(self, response):
        return "," not in response and "，" not in response


@register("keyword_order")
class KeywordOrder(Constraint):
    """Every keyword appears, and their first occurrences are in the given order (ordering constraint)."""

    keywords: list

    def check(self, response):
        low = response.lower()
        positions = [low.find(k.lower()) for k in self.keywords]
        return all(p >= 0 for p in positions) and positions == sorted(positions)


# ---- language detection (offline): Unicode scripts, then stop words for Latin-script languages --------

SCRIPT_LANGUAGES: dict[str, tuple[str, ...]] = {
    # language -> Unicode name prefixes of its letters
    "ru": ("CYRILLIC",), "uk": ("CYRILLIC",), "bg": ("CYRILLIC",), "el": ("GREEK",), "ar": ("ARABIC",),
    "fa": ("ARABIC",), "ur": ("ARABIC",), "he": ("HEBREW",), "hi": ("DEVANAGARI",), "mr": ("DEVANAGARI",),
    "ne": ("DEVANAGARI",), "bn": ("BENGALI",), "gu": ("GUJARATI",), "pa": ("GURMUKHI",), "ta": ("TAMIL",),
    "te": ("TELUGU",), "kn": ("KANNADA",), "ml": ("MALAYALAM",), "th": ("THAI",), "ko": ("HANGUL",),
    "ja": ("HIRAGANA", "KATAKANA"), "zh": ("CJK",), "ka": ("GEORGIAN",), "hy": ("ARMENIAN",),
    "am": ("ETHIOPIC",),
}  # fmt: skip
# Languages sharing a script are told apart by characteristic letters where possible.
_DISTINCT_LETTERS = {"uk": "іїєґ", "bg": "ъ", "fa": "پچژگ", "ur": "ٹڈڑں"}
LATIN_STOPWORDS: dict[str, frozenset[str]] = {
    k: frozenset(v.split())
    for k, v in {
        "en": "the and of to is in that it was for with as on be at by this have from or are not but",
        "de": "der die und das ist nicht ich ein eine zu den mit sich auf dem des auch es sie wir",
        "fr": "le la les et des est une un du que dans pour pas qui sur au avec ce il elle nous vous",
        "es": "el la los las y de que en un una es por con para no se del al lo como pero más",
        "it": "il lo la gli le e di che un una per non con del della sono è si nel alla anche",
        "pt": "o a os as e de que um uma do da em para não com se por mais dos das é você",
        "nl": "de het een en van is dat niet ik je in op te zijn met voor die maar ook",
        "sv": "och att det som en är på för med inte jag den till av har de om ett",
        "da": "og at det er en til på for med ikke jeg den af har de som et vi",
        "no": "og det er en til på for med ikke jeg den av har de som et vi ikkje",
        "fi": "ja on ei se että hän oli kun mutta ovat tai myös kuin niin tämä",
        "pl": "i w nie się na z że to jest do jak co ale po tak od przez",
        "tr": "ve bir bu da de için ile çok ne daha gibi olarak ama var değil",
        "id": "dan yang di ini itu dengan untuk tidak dari dalam akan ada juga saya",
        "vi": "và của là có không được trong cho một những các này người với",
        "sw": "na ya wa kwa ni za katika la kuwa hii au lakini pia sana",
    }.items()
}


def _script(ch: str) -> str | None:
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ")[0] if name else None


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of the text's dominant language, or None if unsure. Offline and deterministic."""
    scripts: dict[str, int] = {}
    for ch in text:
        s = _script(ch)
        if s:
            scripts[s] = scripts.get(s, 0) + 1
    if not scripts:
        return None
    top = max(scripts, key=scripts.get)
    if top == "LATIN":
        words = [w.lower() for w in _WORD_RE.findall(text)]
        hits = {lang: sum(w in stop for w in words) for lang, stop in LATIN_STOPWORDS.items()}
        best = max(hits, key=hits.get)
        return best if hits[best] > 0 else None
    if top in ("HIRAGANA", "KATAKANA") or (top == "CJK" and ("HIRAGANA" in scripts or "KATAKANA" in scripts)):
        return "ja"
    candidates = [lang for lang, prefixes in SCRIPT_LANGUAGES.items() if top in prefixes]
    for lang in candidates:
        if lang in _DISTINCT_LETTERS and any(c in text for c in _DISTINCT_LETTERS[lang]):
            return lang
    return candidates[0] if candidates else None


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
    """IFEval's loose-accuracy transformations of a response."""
    lines = response.split("\n")
    base = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [v for v in base + [b.replace("*", "") for b in base] if v.strip()]


def evaluate(constraints: Sequence[Constraint], response: str) -> tuple[list[bool], list[bool]]:
    """(strict, loose) verdict per constraint."""
    strict = [c.check(response) for c in constraints]
    variants = loose_variants(response)
    loose = [s or any(c.check(v) for v in variants) for c, s in zip(constraints, strict)]
    return strict, loose


@dataclasses.dataclass(frozen=True)
class InstructConfig:
    mode: str = "strict"  # "strict" or "loose": which verdicts the score uses

    def __post_init__(self):
        if self.mode not in ("strict", "loose"):
            raise ValueError(f"mode must be 'strict' or 'loose', got {self.mode!r}")


class InstructReward(RewardFunction):
    """Fraction of the record's ``constraints`` the completion (after ``</think>``) meets."""

    domain = "instruct"

    def __init__(self, config: InstructConfig | None = None, **overrides: Any):
        self.config = dataclasses.replace(config or InstructConfig(), **overrides)

    def reference(self, record: Mapping[str, Any], index: int) -> list[Constraint]:
        specs = field(record, "constraints", index)
        where = f"record {index}: field 'constraints'"
        if not isinstance(specs, list) or not specs:
            raise RewardSpecError(f"{where}: must be a non-empty list")
        return [build_constraint(s, f"{where}[{j}]") for j, s in enumerate(specs)]

    def score_batch(self, references: list, completions: list[str]) -> list[RewardResult]:
        return [self.score_one(cs, c) for cs, c in zip(references, completions)]

    def score_one(self, constraints: list[Constraint], completion: str) -> RewardResult:
        response = completion.rpartition("</think>")[2].strip() if "</think>" in completion else completion.strip()
        strict, loose = evaluate(constraints, response)
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
