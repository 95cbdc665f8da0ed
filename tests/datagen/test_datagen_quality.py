"""vt data filter / dedup / decontam: planted cases, no false positives, reports, resume after a kill."""
import argparse
import json

import pyarrow.parquet as pq
import pytest

from eval_helpers import AIME, aime_rows  # noqa: F401 (aime_rows: a session fixture)
from vt.datagen import commands
from vt.io import ResumableWriter
from vt.datagen.quality import DedupConfig, Deduplicator, FilterConfig, filter_step, templated_score
from vt.datagen.stages import run_stage


def vt_data(*argv):
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["data", *argv, "--no-progress"])
    return args.func(args)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat(i, prompt, response=None):
    row = {"id": f"r{i}", "prompt": prompt}
    if response is not None:
        row["response"] = response
    return row


DISJOINT = [
    "Write a function that reverses a linked list in place and returns the new head of the list.",
    "Explain why the sky appears blue during the day and red at sunset, using Rayleigh scattering.",
    "A train leaves the station at noon at sixty miles per hour; when does it reach the city two hundred miles away?",
    "Prove that the square root of two is irrational by assuming it equals a ratio of coprime integers.",
    "Summarise the causes of the French Revolution in three short paragraphs for a high school audience.",
    "Find all real x such that x squared minus five x plus six equals zero, and explain each step.",
]


def test_decontam_planted_overlaps_and_no_false_positives(tmp_path, aime_rows):
    problems = [r["prompt"][0]["content"] for r in aime_rows]
    planted = {
        "r100": "Here is a nice exercise. " + problems[3].upper().replace(" ", "  ") + " Good luck!",
        "r101": "Solve: " + " ".join(problems[7].split()[5:25]) + " and then add one.",  # a 20-word span
    }
    rows = [chat(i, t) for i, t in enumerate(DISJOINT)] + [chat(k[1:], v) for k, v in planted.items()]
    rows.append(chat(200, "Compute it.", response="Recall: " + " ".join(problems[12].split()[:16])))  # in a response
    inp = write_jsonl(tmp_path / "train.jsonl", rows)
    assert vt_data("decontam", inp, str(tmp_path / "clean.parquet"), "--eval", str(AIME)) == 0
    kept = pq.read_table(tmp_path / "clean.parquet").to_pylist()
    assert [r["id"] for r in kept] == [f"r{i}" for i in range(len(DISJOINT))]
    rejected = [json.loads(x) for x in (tmp_path / "clean.parquet.rejected.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejected] == ["contaminated"] * 3
    assert [r["detail"]["eval_item"] for r in rejected] == [f"{AIME}:{i}" for i in (3, 7, 12)]
    report = json.loads((tmp_path / "clean.parquet.report.json").read_text())
    assert report["counts"] == {"contaminated": 3, "kept": 6}


def test_filter_repetition_and_templates():
    good = "We factor the quadratic, check both roots against the domain, and conclude that the sum is 70."
    loop = "so the answer is 5 and " * 30
    template = " ".join(f"Try x = {i}: then {i} squared is {i * i}, which is not the answer." for i in range(12))
    assert templated_score(template, 6) > 0.7 and templated_score(good, 6) == 0.0
    step = filter_step(FilterConfig(require_response=True))
    reasons = [step(i, "", chat(i, "Q?", r))[1] for i, r in enumerate([good, loop, template])]
    assert reasons == ["kept", "repetition", "templated"]
    assert step(9, "", chat(9, "Q?"))[1] == "no_response"
    assert step(9, "", {"id": "x"})[1] == "malformed:missing_field"


def test_dedup_exact_and_near(tmp_path):
    base = ("the quick brown fox jumps over the lazy dog while the farmer counts sheep in the meadow near "
            "the old mill and the river runs quietly past the village toward the distant sea under a grey sky "
            "while children play by the bridge and the baker sells warm bread to travellers who stop on their "
            "long way to the market town beyond the hills where merchants trade wool and salt every week")
    rows = [chat(0, base), chat(1, base.upper() + " !"), chat(2, base.replace("farmer", "shepherd")),
            chat(3, DISJOINT[0]), chat(4, DISJOINT[1]), chat(5, base.replace("grey", "blue"))]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert vt_data("dedup", inp, str(tmp_path / "out.jsonl")) == 0
    kept = [json.loads(x)["id"] for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert kept == ["r0", "r3", "r4"]
    rej = [json.loads(x) for x in (tmp_path / "out.jsonl.rejected.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rej] == ["exact_duplicate", "near_duplicate", "near_duplicate"]
    # one word changed among ~75 five-word shingles: Jaccard (75 - 5) / (75 + 5) ~ 0.88
    assert rej[1]["detail"]["jaccard"] >= 0.8
    # exact only
    dd = Deduplicator(DedupConfig(near_threshold=0.0))
    assert [dd.check(str(i), t)[0] for i, t in enumerate([base, base + ".", base + " extra"])] == \
        ["kept", "exact_duplicate", "kept"]


def test_killed_stage_resumes_to_the_same_output(tmp_path):
    base = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
    rows = [chat(i, f"{base} {i % 7}" if i % 3 else f"{base} {i}") for i in range(40)]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    assert vt_data("dedup", inp, str(tmp_path / "straight.jsonl"), "--near-threshold", "0") == 0

    from vt.datagen.quality import dedup_step
    w = ResumableWriter(tmp_path / "resumed.jsonl")
    inner = dedup_step(DedupConfig(near_threshold=0.0), w.kept_rows)

    def dying(i, where, row):
        if i == 25:
            raise KeyboardInterrupt
        return inner(i, where, row)
    with pytest.raises(KeyboardInterrupt):
        run_stage(inp, w, dying, progress=False)
    with open(tmp_path / "resumed.jsonl", "a") as f:  # a line torn by the kill
        f.write('{"id": "r99", "pro')
    assert vt_data("dedup", inp, str(tmp_path / "resumed.jsonl"), "--near-threshold", "0") == 0
    for suffix in ("", ".rejected.jsonl"):
        assert (tmp_path / f"resumed.jsonl{suffix}").read_text() == (tmp_path / f"straight.jsonl{suffix}").read_text()
    a = json.loads((tmp_path / "resumed.jsonl.report.json").read_text())["counts"]
    assert a == json.loads((tmp_path / "straight.jsonl.report.json").read_text())["counts"]
