"""Instruction-constraint reward: every registered type, strict vs loose, partial credit, bad specs."""
from __future__ import annotations

import pytest

from vt.rewards.base import RewardSpecError
from vt.rewards.instruct import (
    IFEVAL_IDS,
    REGISTRY,
    InstructReward,
    build_constraint,
    count_sentences,
    count_words,
    detect_language,
    from_ifeval,
)

# (spec, a response that satisfies it, one that does not) for every registered type.
CASES = [
    ({"type": "keywords_present", "keywords": ["apple", "Pie"]}, "I baked an apple pie.", "I baked a cake."),
    ({"type": "keywords_absent", "keywords": ["bad"]}, "A badge is fine.", "That was bad."),
    ({"type": "keyword_frequency", "keyword": "cat", "relation": "at least", "num": 2}, "cat CAT", "one cat"),
    ({"type": "letter_frequency", "letter": "z", "relation": "less than", "num": 2}, "zoo", "zigzag"),
    ({"type": "language", "language": "de"}, "Der Hund ist nicht hier und die Katze auch.", "The dog is here."),
    ({"type": "length_sentences", "relation": "at most", "num": 2}, "One. Two!", "One. Two. Three?"),
    ({"type": "length_words", "relation": "at least", "num": 5}, "one two three four five", "one two three"),
    ({"type": "length_paragraphs", "num": 2}, "First part.\n***\nSecond part.", "Just one."),
    ({"type": "nth_paragraph_first_word", "num_paragraphs": 2, "nth": 2, "first_word": "then"},
     "Start here.\n\nThen finish.", "Start here.\n\nNow finish."),
    ({"type": "placeholders", "num": 2}, "Send to [name] at [address].", "Send to [name]."),
    ({"type": "postscript", "marker": "P.S."}, "Hello.\nP.S. bye", "Hello."),
    ({"type": "bullets", "num": 2}, "* one\n* two", "* one\n* two\n- three"),
    ({"type": "constrained_response"}, "My answer is yes.", "Sure thing."),
    ({"type": "highlights", "num": 2}, "*one* and **two**", "*one* only"),
    ({"type": "sections", "num": 2, "splitter": "Section"}, "Section 1\nA\nSection 2\nB", "Section 1\nA"),
    ({"type": "json_format"}, '```json\n{"a": 1}\n```', "{'a': 1}"),
    ({"type": "title"}, "<<Joy>>\nA poem.", "Joy\nA poem."),
    ({"type": "two_responses"}, "First.\n******\nSecond.", "First.\n******\nFirst."),
    ({"type": "repeat_prompt", "prompt": "Write a poem."}, "Write a poem. Roses...", "Roses..."),
    ({"type": "start_phrase", "phrase": "Dear sir"}, "dear Sir, hello", "Hello, dear sir"),
    ({"type": "end_phrase", "phrase": "Any other questions?"}, "Done. Any other questions?", "Any other questions? Done."),
    ({"type": "quotation"}, '"All quoted."', 'Not "quoted".'),
    ({"type": "capital_word_frequency", "relation": "at least", "num": 2}, "THIS IS loud", "This is quiet"),
    ({"type": "english_uppercase"}, "THIS ANSWER IS WRITTEN IN ENGLISH AND IN CAPITALS.", "DAS IST NICHT ENGLISCH UND DIE KATZE AUCH NICHT."),
    ({"type": "english_lowercase"}, "this answer is written in english and in lower case.", "not All lower"),
    ({"type": "all_uppercase"}, "* CAT\n* OWL 123", "Not All Caps"),
    ({"type": "all_lowercase"}, "* lime, kiwi", "not All lower"),
    ({"type": "no_commas"}, "No commas here.", "Commas, here."),
    ({"type": "keyword_order", "keywords": ["first", "second"]}, "first then second", "second then first"),
]  # fmt: skip


def test_every_registered_type_has_a_case():
    assert {c[0]["type"] for c in CASES} == set(REGISTRY)
    assert len(IFEVAL_IDS) == 25  # all of IFEval's instruction types map onto a registered class


@pytest.mark.parametrize("spec, good, bad", CASES, ids=[c[0]["type"] for c in CASES])
def test_constraint_accepts_and_rejects(spec, good, bad):
    c = build_constraint(spec, "c")
    assert c.check(good) and not c.check(bad)


def test_reward_is_the_fraction_met_after_think():
    constraints = [
        {"type": "length_words", "relation": "at most", "num": 5},
        {"type": "no_commas"},
        {"type": "all_lowercase"},
        {"type": "title"},
    ]
    with InstructReward() as r:
        res = r([{"constraints": constraints}] * 2, ["<think>Long, LONG thinking.</think>the weather is nice, today", "<<t>> the weather is nice"])
    assert res[0].score == pytest.approx(0.5) and res[0].failure == "wrong"
    assert sorted(res[0].details["failed"]) == ["no_commas", "title"]
    assert res[1].score == 1.0 and res[1].failure is None


def test_loose_mode_forgives_a_preamble_and_markdown():
    constraints = [{"type": "all_lowercase"}, {"type": "quotation"}]
    response = 'Sure! Here it is:\n"**all lowercase**"'
    with InstructReward(mode="loose") as loose, InstructReward() as strict:
        assert strict([{"constraints": constraints}], [response])[0].score == 0.0
        res = loose([{"constraints": constraints}], [response])[0]
    assert res.score == 1.0 and res.details["strict_score"] == 0.0 and res.details["loose_score"] == 1.0


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"type": "length_wordz", "num": 3}, r"\[0\]\.type: unknown constraint type 'length_wordz'"),
        ({"type": "length_words", "num": 3}, r"\[0\]\.relation: missing argument"),
        ({"type": "length_words", "relation": "about", "num": 3}, r"\[0\]: 'relation' must be one of"),
        ({"type": "length_words", "relation": "at least", "num": "3"}, r"\[0\]\.num: must be a non-negative integer"),
        ({"type": "no_commas", "strict": True}, r"\[0\]\.strict: unknown argument"),
        ({"type": "keywords_present", "keywords": []}, r"\[0\]\.keywords: must be a non-empty list"),
        ({"type": "language", "language": "tlh"}, r"\[0\]: 'language' 'tlh' is not one langdetect reports"),
        ({"type": "letter_frequency", "letter": "ab", "relation": "at least", "num": 1}, r"\[0\]: 'letter' must be one ASCII letter"),
        ("no_commas", r"\[0\]: a constraint must be an object"),
    ],
)
def test_bad_constraints_are_errors_naming_the_field(spec, match):
    with InstructReward() as r, pytest.raises(RewardSpecError, match=r"record 0: field 'constraints'" + match):
        r([{"constraints": [spec]}], ["x"])


def test_from_ifeval_maps_ids_and_kwargs():
    specs = from_ifeval(
        ["length_constraints:number_words", "punctuation:no_comma", "detectable_format:multiple_sections"],
        [{"relation": "less than", "num_words": 50, "keywords": None}, {}, {"section_spliter": "PART", "num_sections": 3}],
    )
    assert specs == [
        {"type": "length_words", "relation": "less than", "num": 50},
        {"type": "no_commas"},
        {"type": "sections", "splitter": "PART", "num": 3},
    ]
    with pytest.raises(RewardSpecError, match="unsupported IFEval instruction"):
        from_ifeval(["made:up"], [{}])


def test_text_statistics_as_ifeval_counts_them():
    assert count_words("Hello, world! It's 2024.") == 5  # \w+ tokens, as IFEval counts
    assert count_sentences("Dr. Smith arrived. He sat down! Did he? Yes") == 4
    assert count_sentences("") == 0


@pytest.mark.parametrize(
    "text, lang",
    [
        ("Привет, как у тебя дела сегодня?", "ru"),
        ("Привіт, як у тебе справи? Їжак.", "uk"),
        ("你好，今天天气很好。", "zh-cn"),
        ("こんにちは、今日はいい天気ですね。", "ja"),
        ("안녕하세요, 오늘 날씨가 좋네요.", "ko"),
        ("مرحبا كيف حالك اليوم", "ar"),
        ("नमस्ते, आप कैसे हैं?", "hi"),
        ("Bonjour, je suis très content de vous voir et le chat aussi.", "fr"),
        ("Hola, ¿cómo estás? El perro y la casa son grandes.", "es"),
        ("The weather is nice and it is warm today.", "en"),
        ("12345 !!!", None),
    ],
)
def test_language_detection_offline(text, lang):
    assert detect_language(text) == lang


def test_adversarial_text_does_not_hang():
    import threading

    text = "*" * 200_000 + "[" * 100_000 + "a. " * 100_000
    constraints = [{"type": t} for t in ("title", "json_format", "quotation", "two_responses")]
    constraints += [{"type": "highlights", "num": 1}, {"type": "placeholders", "num": 1}, {"type": "bullets", "num": 1}]
    constraints += [{"type": "length_sentences", "relation": "at least", "num": 1}]
    box = {}
    with InstructReward(mode="loose") as r:
        t = threading.Thread(target=lambda: box.setdefault("r", r([{"constraints": constraints}], [text])[0]))
        t.start()
        t.join(timeout=120)  # a hang detector (catastrophic regex backtracking), not a speed test
    assert not t.is_alive() and 0.0 <= box["r"].score <= 1.0


def test_tokeniser_constraints_fail_past_their_length_cap():
    from vt.rewards.instruct import MAX_TOKENIZED_CHARS

    ok = build_constraint({"type": "length_sentences", "relation": "at least", "num": 1}, "c")
    caps = build_constraint({"type": "capital_word_frequency", "relation": "at least", "num": 1}, "c")
    short = "A SENTENCE. " * (MAX_TOKENIZED_CHARS // 12 - 1)
    assert ok.check(short) and caps.check(short)
    assert not ok.check(short + "MORE. " * 4) and not caps.check(short + "MORE. " * 4)
