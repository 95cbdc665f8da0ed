"""Streaming verification: each sample is scored as soon as its slot finishes, beside decoding, and the step gets
exactly the verdicts of scoring the whole batch after decoding (the serial path), for every reward domain."""
import hashlib
import random
import threading

import numpy as np
import pytest

from vt import VtError
from vt.data.sources import Record
from vt.data.tokenizer import build_tiny_tokenizer
from vt.model.config import preset
from vt.model.qwen2 import create_model
from vt.rewards.base import (RewardFunction, RewardResult, RewardSpecError, failed, field, map_bounded, passed,
                             verifier_error)
from vt.rewards.registry import make_reward
from vt.rewards.rubric import RubricReward
from vt.rewards.streaming import StreamingScorer, busy_seconds
from vt.rl.rollouts import rollout_and_score
from vt.sampling.config import SamplerConfig
from vt.sampling.engine import Engine


class HashReward(RewardFunction):
    """A real RewardFunction standing in for a slow verifier: a deterministic score from a hash of (reference,
    completion), with partial credit, verifier errors and checker exceptions (map_bounded turns those into
    verifier errors), sleeping `delay` s per item as a sandbox or a judge would wait."""

    domain = "hash"
    streams = True

    def __init__(self, workers=2, delay=0.0, spec_error_on=None, started=None):
        self._workers, self.delay, self.spec_error_on, self.started = workers, delay, spec_error_on, started
        self.wake = threading.Event()  # never set: wait(delay) is a sleep
        self.batch_sizes = []  # score_batch calls: the whole batch after decoding, or one item at a time

    @property
    def workers(self):
        return self._workers

    def reference(self, record, index):
        return str(field(record, "ground_truth", index))

    def score_batch(self, references, completions):
        self.batch_sizes.append(len(references))
        return map_bounded(lambda rc: self.score_one(*rc), list(zip(references, completions)), self.workers)

    def score_one(self, ref, completion):
        if self.started is not None:
            self.started.set()
        self.wake.wait(self.delay)
        if completion == self.spec_error_on:
            raise RewardSpecError(f"record {ref}: a malformed test")
        h = hashlib.sha256((ref + "|" + completion).encode()).digest()[0]
        if h % 7 == 0:
            return verifier_error("the checker timed out")
        if h % 11 == 0:
            raise ValueError("a checker bug")
        score = (h % 4) / 3
        return passed() if score == 1 else failed("wrong") if score == 0 else RewardResult(score, None)


class RaisingReward(HashReward):
    """score_batch without map_bounded: an exception out of one item's check ends the batch (as instruct's would)."""

    def score_batch(self, references, completions):
        return [self._raw(r, c) for r, c in zip(references, completions)]

    def _raw(self, ref, completion):
        if ref == "boom":
            raise RuntimeError(f"checker crashed on {ref}")
        return passed()


def judge(conversations):
    """A deterministic judge: a score from the conversation's hash."""
    return [f"Score: {hashlib.sha256(repr(c).encode()).digest()[0] % 10 + 1}" for c in conversations]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def tiny():
    return create_model(preset("tiny"), seed=3)


def engine(tiny, tok, **over):
    # fewer slots than samples: slots finish and refill at different decode calls
    cfg = dict(batch_size=8, max_new_tokens=16, steps_per_call=4, temperature=1.0, seed=0)
    return Engine(tiny, SamplerConfig(**{**cfg, **over}), tokenizer=tok)


def rec(i, domain, ground_truth=None, content="Write f(x) that returns x+1.", **metadata):
    return Record(id=f"{domain}-{i}", domain=domain, messages=({"role": "user", "content": content},),
                  ground_truth=ground_truth, metadata=metadata, where=f"data.jsonl:{i + 1}")


CODE_TESTS = [{"fn_name": "f", "args": [2], "expected": 3}]


def mixed_records():
    """Every reward domain in one batch, interleaved: math, code, stem, instruct and the hash stand-in stream;
    rubric (one judge call for its batch) is scored after decoding in both paths."""
    kinds = [("math", {"ground_truth": "3"}), ("code", {"tests": CODE_TESTS}), ("instruct", {"constraints": [
        {"type": "no_commas"}]}), ("stem", {"ground_truth": "A"}), ("hash", {"ground_truth": "h"}),
        ("rubric", {"rubric": "coherence"}), ("instruct", {"constraints": [{"type": "all_lowercase"}]}),
        ("hash", {"ground_truth": "g"}), ("math", {"ground_truth": "x+1"}), ("code", {"tests": CODE_TESTS})]
    out = []
    for i, (d, meta) in enumerate(kinds):
        gt = meta.pop("ground_truth", None)
        out.append(rec(i, d, gt, content=f"Task {i}: write f(x) or say x+{i}.", **meta))
    return out


@pytest.fixture(scope="module")
def rewards():
    r = {"math": make_reward("math"), "code": make_reward("code"),  # 2 workers each (the default)
         "instruct": make_reward("instruct"), "stem": make_reward("stem"), "hash": HashReward(),
         "rubric": RubricReward(judge)}
    yield r
    for f in r.values():
        f.close()


def score(eng, tok, records, rewards, stream, C=4, seed=11):
    return rollout_and_score(eng, tok, records, rewards, group_size=C, seed=seed, max_prompt_tokens=256,
                             stream=stream)


def test_streamed_rewards_equal_the_serial_path_for_every_domain(tiny, tok, rewards):
    records = mixed_records()
    eng = engine(tiny, tok)
    serial = score(eng, tok, records, rewards, stream=False)
    assert rewards["hash"].batch_sizes == [2 * 4]
    streamed = score(eng, tok, records, rewards, stream=True)
    assert rewards["hash"].batch_sizes == [2 * 4] + [1] * (2 * 4)  # scored item by item as samples finished
    ids = lambda s: [[x.completion_ids for x in g] for g in s.samples]  # noqa: E731
    assert ids(streamed) == ids(serial)  # the sampler's keyed randomness does not see the verifier
    for name in ("rewards", "valid", "correct", "lengths", "truncated"):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(serial, name), err_msg=name)
    assert streamed.rewards.dtype == serial.rewards.dtype
    h = [q for q, r in enumerate(records) if r.domain == "hash"]
    assert len(set(serial.rewards[h].ravel().tolist())) > 1 and not serial.valid[h].all()  # a real spread
    assert serial.time_overlap_s == 0 and serial.time_verify_s > 0
    assert streamed.time_verify_s >= streamed.time_overlap_s >= 0


def test_streaming_scorer_gives_the_batch_verdicts_in_any_arrival_order(rewards):
    """Real verifiers, completions that pass and fail: submitted in a shuffled order, gathered in index order,
    the same (score, failure) as the reward on the whole batch."""
    ok_code = "```python\ndef f(x):\n    return x + 1\n```"
    bad_code = "```python\ndef f(x):\n    return x - 1\n```"
    crash = "```python\ndef f(x):\n    raise SystemExit(3)\n```"
    cases = {
        "math": ([{"ground_truth": "3"}, {"ground_truth": "1/2"}, {"ground_truth": "x+1"}],
                 ["so \\boxed{3}", "\\boxed{0.5}", "no box"]),
        "code": ([{"tests": CODE_TESTS}] * 4, [ok_code, bad_code, crash, "no code"]),
        "stem": ([{"ground_truth": "A"}, {"ground_truth": "2.5"}], ["The answer is (A)", "\\boxed{3.1}"]),
        "instruct": ([{"constraints": [{"type": "no_commas"}]}] * 2, ["a b c", "a, b"]),
    }
    for domain, (records, completions) in cases.items():
        reward = rewards[domain]
        want = reward(records, completions)
        order = list(range(len(records)))
        random.Random(0).shuffle(order)
        with StreamingScorer(reward, records) as scorer:
            for i in order:
                scorer.submit(i, completions[i])
            got = scorer.results()
        assert [(r.score, r.failure) for r in got] == [(r.score, r.failure) for r in want], domain
        assert len({r.score for r in want}) > 1, domain  # each domain's cases pass and fail


def test_an_older_scorer_of_a_reward_is_served_first():
    """Two scorers of one reward open at once (k >= 1: the batch the learner takes next, still verifying, and the
    batch ahead, streaming in): the older one's items take the reward's slots first, whatever the arrival order."""
    order, first_started, go = [], threading.Event(), threading.Event()

    class InOrder(HashReward):
        def score_one(self, ref, completion):
            order.append(completion)
            first_started.set()
            go.wait(30)
            return passed()

    reward, records = InOrder(workers=1), [{"ground_truth": "1"}] * 3
    with StreamingScorer(reward, records) as older, StreamingScorer(reward, records) as younger:
        older.submit(0, "a0")
        assert first_started.wait(30)  # a0 holds the reward's one slot
        younger.submit(0, "b0")
        younger.submit(1, "b1")
        older.submit(1, "a1")
        younger.submit(2, "b2")
        older.submit(2, "a2")
        go.set()
        assert [r.score for r in older.results() + younger.results()] == [1.0] * 6
    assert order == ["a0", "a1", "a2", "b0", "b1", "b2"]


def test_verification_overlaps_decoding(tiny, tok):
    """A slow verifier (0.05 s per item) and 32 samples on 8 slots: the first samples' verdicts start while the
    later ones still decode. Made certain, not left to timing: the engine waits at its first hand-over until a
    verdict has started, then decodes the remaining slots."""
    started = threading.Event()
    slow = {"hash": HashReward(workers=2, delay=0.05, started=started)}
    records = [rec(i, "hash", f"g{i}") for i in range(8)]
    eng = engine(tiny, tok, stop_token_ids=())  # every sample runs to its length: 4 waves of 8
    serial = score(eng, tok, records, slow, stream=False)
    events = []
    generate = eng.generate

    def gen(*args, on_finished=None, **kwargs):
        def hook(i, j, s):
            on_finished(i, j, s)
            if not events:
                assert started.wait(60)  # the verifier pool picked up the first sample
            events.append(("finished", eng.last_stats.decode_calls))
        out = generate(*args, on_finished=hook, **kwargs)
        events.append(("returned", eng.last_stats.decode_calls))
        return out
    eng.generate = gen
    started.clear()
    streamed = score(eng, tok, records, slow, stream=True)
    assert events[-1][0] == "returned" and len(events) == 8 * 4 + 1
    assert events[0][1] < events[-1][1]  # handed over before the last decode calls ran
    np.testing.assert_array_equal(streamed.rewards, serial.rewards)
    np.testing.assert_array_equal(streamed.valid, serial.valid)
    assert streamed.time_overlap_s > 0  # verification ran while decoding
    assert streamed.time_verify_s >= streamed.time_overlap_s
    assert serial.time_overlap_s == 0


def test_verifier_exceptions_surface_as_in_the_serial_path(tiny, tok):
    """A dataset error raised while checking one item is a VtError naming the batch's first record; an exception
    a reward does not guard ends the step with that exception; neither leaves verifier threads behind."""
    records = [rec(i, "hash", f"g{i}") for i in range(4)]
    eng = engine(tiny, tok)
    probe = score(eng, tok, records, {"hash": HashReward()}, stream=False, seed=5)
    texts = [s.text for g in probe.samples for s in g]
    marker = probe.samples[2][1].text
    assert texts.count(marker) == 1
    errors = {}
    for stream in (False, True):
        with pytest.raises(VtError) as e:
            score(eng, tok, records, {"hash": HashReward(spec_error_on=marker)}, stream=stream, seed=5)
        errors[stream] = str(e.value)
    assert errors[True] == errors[False]
    assert errors[True].startswith("data.jsonl:1 (batch of domain hash): record g2: a malformed test")

    boom = [rec(0, "hash", "g0"), rec(1, "hash", "boom"), rec(2, "hash", "g2")]
    messages = {}
    for stream in (False, True):
        with pytest.raises(RuntimeError, match="checker crashed on boom") as e:
            score(eng, tok, boom, {"hash": RaisingReward()}, stream=stream)
        messages[stream] = str(e.value)
    assert messages[True] == messages[False]
    assert not [t for t in threading.enumerate() if t.name.startswith("vt-verify")]


def test_dataset_errors_in_references_stop_before_decoding(tiny, tok, rewards):
    """A record without its reference fails with the serial path's message, and with streaming before decoding."""
    records = [rec(0, "math", "3"), rec(1, "math", None)]
    eng = engine(tiny, tok)
    messages = {}
    for stream in (False, True):
        calls = eng.stats.decode_calls
        with pytest.raises(VtError) as e:
            score(eng, tok, records, rewards, stream=stream)
        messages[stream] = str(e.value)
        assert (eng.stats.decode_calls == calls) == stream
    assert messages[True] == messages[False]
    assert messages[True].startswith("data.jsonl:1 (batch of domain math): record 4: field 'ground_truth'")


def test_busy_seconds_counts_covered_time_once():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]
    assert busy_seconds(spans) == 4.0
    assert busy_seconds(spans, until=1.5) == 1.5
    assert busy_seconds(spans, until=5.5) == 3.5
    assert busy_seconds([]) == 0.0


def test_a_reward_that_does_not_stream_is_refused():
    with pytest.raises(ValueError, match="does not stream"):
        StreamingScorer(RubricReward(judge), [])


def test_learner_steps_are_the_same_with_and_without_streaming(tmp_path):
    """Two RL steps of the instruct smoke run (random tiny model, rule-based partial-credit rewards): the same
    rollouts, rewards and losses streamed or not; metrics.jsonl carries the step's timings."""
    from rl_helpers import metrics
    from vt.config import load_config, to_dataclass
    from vt.rl.learner import RLConfig, train_rl
    rows = {}
    for stream in (False, True):
        cfg = to_dataclass(RLConfig, load_config("configs/instruct_rl.py:smoke", [
            "--config.train.steps=2", "--config.data.eval=", f"--config.rollout.stream_rewards={stream}"]))
        train_rl(cfg, tmp_path / str(stream))
        rows[stream] = [r for r in metrics(tmp_path / str(stream)) if "loss" in r]
    timings = ("time_sample_s", "time_reward_s", "time_verify_s", "time_overlap_s", "time_train_s", "time_rollout_s")
    for a, b in zip(rows[False], rows[True], strict=True):
        for key in ("rollout_hash", "reward_mean", "accuracy", "verifier_errors", "loss", "grad_norm"):
            assert a[key] == b[key], key
        for r in (a, b):
            assert all(r[t] >= 0 for t in timings) and r["time_verify_s"] >= r["time_overlap_s"]
        assert a["time_overlap_s"] == 0
    assert any(0 < r["reward_mean"] < 1 for r in rows[True])  # verdicts that differ, not all 0 or all 1
