"""Multi-turn samples with tool turns (issue 52): the learner trains on the policy's tokens only. A tool's tokens
(Sample.policy_mask False) are context: no loss, KL, entropy, IS ratio or length penalty on them, in every row
layout (padded, packed, prompts shared), and the objective's per-sequence weights count policy tokens."""

import jax
import numpy as np
import pytest

from packed_check import VOCAB, Setup, compare, config, host_params, padded_reference, row_length
from vt.rl.batches import learner_batches, rollout_metrics, step_advantages
from vt.rl.rollouts import Scored, build_rows, policy_tokens
from vt.sampling.engine import Sample

Q, G = 4, 4


def tool_sample(rng, turns: int, end_in_tool: bool = False) -> Sample:
    """turns tool calls: policy span, tool span, policy span, ...; the tool's tokens carry log-prob 0.0 (the
    engine's convention). end_in_tool: cut inside the last tool turn (a sample that ran out of budget there)."""
    ids, logp, mask = [], [], []
    for t in range(turns + 1):
        n = int(rng.integers(1, 12))
        ids += rng.integers(1, VOCAB, n).tolist()
        logp += (-2.0 - rng.random(n) * 4).tolist()
        mask += [True] * n
        if t < turns:
            m = int(rng.integers(2, 10))
            ids += rng.integers(1, VOCAB, m).tolist()
            logp += [0.0] * m
            mask += [False] * m
            if end_in_tool and t == turns - 1:
                break
    return Sample(ids, logp, "length" if end_in_tool else "stop", policy_mask=np.array(mask), tool_calls=turns,
                  tool_errors=int(turns > 1))


def tool_scored(seed: int = 0) -> Scored:
    """Q groups of G samples: 0-3 tool turns each, one sample ending inside a tool turn, one without a mask
    (every token the policy's), rewards with partial credit and a verifier failure."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, rng.integers(3, 10)).tolist() for _ in range(Q)]
    samples = [[tool_sample(rng, int(rng.integers(0, 4)), end_in_tool=(q, g) == (1, 2)) for g in range(G)]
               for q in range(Q)]
    samples[2][0].policy_mask = None
    rewards = rng.choice([0.0, 0.5, 1.0], size=(Q, G)).astype(np.float32)
    valid = np.ones((Q, G), bool)
    valid[0, 1] = False
    rewards[~valid] = 0.0
    lengths = np.array([[policy_tokens(s) for s in g] for g in samples])
    return Scored(prompts, samples, correct=(rewards == 1.0) & valid, rewards=rewards, valid=valid, lengths=lengths,
                  truncated=np.array([[s.finish_reason == "length" for s in g] for g in samples]),
                  domains=["math"] * Q)


def every_token_the_policys(s: Scored) -> Scored:
    """The mutant: the same samples with the tool tokens counted as actions."""
    samples = [[Sample(x.completion_ids, x.logprobs, x.finish_reason) for x in g] for g in s.samples]
    lengths = np.array([[len(x.completion_ids) for x in g] for g in samples])
    return Scored(s.prompts, samples, s.correct, s.rewards, s.valid, lengths, s.truncated, s.domains)


def policy_rows(s: Scored, T: int) -> np.ndarray:
    """[Y, T] the padded rows' trained slots written from the samples: slot len(prompt) - 1 + j predicts
    completion token j, trained where the policy sampled it (independent of build_rows' loss_mask)."""
    out = np.zeros((Q * G, T), np.float32)
    for i, (p, x) in enumerate((p, x) for p, g in zip(s.prompts, s.samples) for x in g):
        mask = np.ones(len(x.completion_ids), bool) if x.policy_mask is None else x.policy_mask
        n = min(len(mask), T - len(p) + 1)
        out[i, len(p) - 1: len(p) - 1 + n] = mask[:n]
    return out


def test_tool_tokens_are_in_the_rows_but_not_trained_on():
    """Every layout holds every token (the tool turns are context the later policy tokens attend to), and the
    trained slots of each sample predict exactly its policy tokens, in order, with their sampler log-probs."""
    s = tool_scored()
    T = row_length(s)
    assert any(x.policy_mask is not None and not x.policy_mask.all() for g in s.samples for x in g)
    padded = build_rows(s, T, pack=False)
    np.testing.assert_array_equal(padded["loss_mask"], policy_rows(s, T))
    for pack, share in ((False, False), (True, False), (True, True)):
        rows = build_rows(s, T, pack=pack, share=share)
        for i, x in enumerate(x for g in s.samples for x in g):
            policy = np.ones(len(x.completion_ids), bool) if x.policy_mask is None else x.policy_mask
            mine = (rows["sample"] == i) & (rows["loss_mask"] > 0)
            np.testing.assert_array_equal(rows["targets"][mine], np.asarray(x.completion_ids)[policy])
            np.testing.assert_array_equal(rows["sampler_logp"][mine], np.float32(x.logprobs)[policy])
            assert mine.sum() == policy_tokens(x) == s.lengths.reshape(-1)[i]
            # the tool tokens are still targets of the sample's slots (inputs of the next), only untrained
            assert np.isin(np.asarray(x.completion_ids)[~policy], rows["targets"][rows["sample"] == i]).all()


@pytest.fixture(scope="module")
def setup():
    from vt.sharding import MeshConfig, make_mesh
    return Setup(make_mesh(MeshConfig()))


def test_tool_tokens_get_no_loss_kl_or_gradient(setup):
    """The learner's update (packed and shared rows, both aggregations) equals the padded objective
    written from objectives' row functions over the policy tokens only (mask from the samples); the mutant that
    trains on the tool tokens too does not."""
    s = tool_scored()
    T = row_length(s)
    params = [host_params(p) for p in (setup.params, setup.old_params, setup.ref_params)]
    reference = padded_reference(setup.md, *params, s, T, mask=policy_rows(s, T))
    bad = []
    # (the padded layout equals the packed one: tests/rl/test_packed_rl.py; its rows are the reference's here)
    for agg, pack, share in (("seq_mean", True, False), ("seq_mean", True, True), ("token_mean", True, True)):
        loss, grads, _, _ = setup.learner_update(s, config(agg, pack, 128), T, share)
        bad += compare(f"{agg} pack={pack} share={share}", loss, grads, *reference[agg])
    assert not bad, "\n".join(bad)
    loss, grads, _, _ = setup.learner_update(every_token_the_policys(s), config("seq_mean", True, 128), T, True)
    assert compare("mutant", loss, grads, *reference["seq_mean"])


def test_tool_tokens_values_change_nothing(setup):
    """Arbitrary values at the tool tokens' slots (sampler and pi_old log-probs: the IS ratio and the clip; the
    KL reference; the advantage) leave the loss, every gradient and every metric sum (entropy, mismatch KL,
    ratio, tokens) bitwise equal; in the mutant the same change moves them."""
    s = tool_scored(seed=1)
    T = row_length(s)
    cfg = config("seq_mean", True, 128)

    def accumulated(scored, tool_slots=None):
        adv, _ = step_advantages(scored, cfg.mgpo)
        (micro,), _, _ = learner_batches(scored, adv, T, 0, cfg, setup.mesh, share=True)
        rng = np.random.default_rng(7)
        for j, mb in enumerate(micro):
            inputs = {k: mb[k] for k in ("input_ids", "targets", "positions", "segment_ids")}
            mb["old_logp"], mb["ref_logp"] = setup.logps(setup.old_params, inputs), setup.logps(setup.ref_params, inputs)
            if tool_slots is not None:
                for key in ("sampler_logp", "old_logp", "ref_logp", "adv"):
                    v = np.asarray(mb[key])
                    v = np.where(tool_slots[j], rng.uniform(-6, 0, v.shape), v).astype(v.dtype)
                    mb[key] = jax.device_put(v, mb[key].sharding)
        acc = setup.programs[True][1]._accumulated(setup.params, micro)
        return jax.tree.map(np.asarray, acc), micro

    plain, micro = accumulated(s)
    mutant = every_token_the_policys(s)
    plain_mutant, micro_mutant = accumulated(mutant)
    tool_slots = [(np.asarray(mm["loss_mask"]) > 0) & (np.asarray(mb["loss_mask"]) == 0)
                  for mb, mm in zip(micro, micro_mutant)]
    assert sum(t.sum() for t in tool_slots) == sum(len(x.completion_ids) - policy_tokens(x) for g in s.samples for x in g)
    assert plain["completion_tokens"] == s.lengths.sum()
    changed, _ = accumulated(s, tool_slots)
    for key in plain:
        jax.tree.map(np.testing.assert_array_equal, plain[key], changed[key])
    changed_mutant, _ = accumulated(mutant, tool_slots)
    assert plain_mutant["loss"] != changed_mutant["loss"]
    assert plain_mutant["is_weight_mean"] != changed_mutant["is_weight_mean"]


def test_tool_turns_do_not_count_as_response_length():
    """Long2Short's shaping, the advantages and the length metrics count the policy's tokens: longer tool
    outputs change none of them (counting every completion token, they would)."""
    s = tool_scored(seed=2)
    longer = [[Sample(list(x.completion_ids) + [3] * 20, list(x.logprobs) + [0.0] * 20, x.finish_reason,
                      policy_mask=np.concatenate([x.policy_mask, np.zeros(20, bool)]))
               if x.policy_mask is not None else x for x in g] for g in s.samples]
    t = Scored(s.prompts, longer, s.correct, s.rewards, s.valid,
               np.array([[policy_tokens(x) for x in g] for g in longer]), s.truncated, s.domains)
    np.testing.assert_array_equal(s.lengths, t.lengths)
    m = config("seq_mean", True, 128).mgpo  # long2short_lambda 0.2
    assert m.long2short_lambda > 0
    np.testing.assert_array_equal(step_advantages(s, m)[0], step_advantages(t, m)[0])
    a, b = rollout_metrics(s, ["math"]), rollout_metrics(t, ["math"])
    assert a["response_len_mean"] == b["response_len_mean"] == s.lengths.mean()
    full = every_token_the_policys(t)
    assert not np.array_equal(step_advantages(full, m)[0], step_advantages(s, m)[0])


def test_tool_samples_keep_their_masks_through_the_rollout_buffer():
    """An asynchronous run's checkpoint holds buffered groups: their samples' policy masks and tool call counts
    come back with them (else a resumed run would train on the tool tokens, or shape rewards without the calls)."""
    from vt.rl.buffer import RolloutBuffer
    s = tool_scored(seed=3)
    buf = RolloutBuffer(max_staleness=1)
    buf.put(s, version=0)
    again = RolloutBuffer(max_staleness=1)
    again.set_state(buf.get_state())
    back, _ = again.take(Q, version=1)
    for g, h in zip(s.samples, back.samples):
        for x, y in zip(g, h):
            assert (x.policy_mask is None) == (y.policy_mask is None)
            assert (x.tool_calls, x.tool_errors) == (y.tool_calls, y.tool_errors)  # tool_call_reward, metrics
            if x.policy_mask is not None:
                np.testing.assert_array_equal(x.policy_mask, y.policy_mask)
    T = row_length(s)
    np.testing.assert_array_equal(build_rows(s, T)["loss_mask"], build_rows(back, T)["loss_mask"])


def test_tool_sample_is_graded_on_its_final_answer(tmp_path):
    """The verifier reads the text after the last tool turn: a \\boxed{} the tool printed or an earlier turn
    wrote is not the answer; a stop string's cut (the engine's text) is kept."""
    from vt.data.tokenizer import build_tiny_tokenizer
    from vt.tools.answer import final_answer
    tok = build_tiny_tokenizer(tmp_path / "tok", ["<tool_call> print(2+3) </tool_call> <tool_response> \\boxed{7}"] * 5,
                               vocab_size=300)
    turns = [("maybe \\boxed{4} <tool_call>print(2+3)</tool_call>", True),
             ("<|im_end|>\n<|im_start|>user\n<tool_response>\n\\boxed{7}\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n", False), ("so \\boxed{5}<|im_end|>", True)]
    ids, mask = [], []
    for text, policy in turns:
        t = tok.encode(text)
        ids, mask = ids + t, mask + [policy] * len(t)
    sample = Sample(ids, [0.0] * len(ids), "stop", policy_mask=np.array(mask))
    assert final_answer(sample, tok) == "so \\boxed{5}"
    sample.text = tok.decode(ids, skip_special_tokens=True)[:-2]  # as if a stop string "5}" cut it
    assert final_answer(sample, tok) == "so \\boxed{"
    assert "\\boxed{4}" in final_answer(Sample(ids, [0.0] * len(ids), "stop"), tok)  # one turn: all of it


def test_tool_call_reward_and_metrics():
    """mgpo.tool_call_reward adds its value per call to the reward the advantages see (the binary correctness,
    and so w(q), stays the verifier's); the step's metrics count calls, the share that called without an error
    turn, and say which length is whose."""
    import dataclasses
    from vt.rl import objectives as obj
    s = tool_scored(seed=4)
    m = dataclasses.replace(config("seq_mean", True, 128).mgpo, long2short_lambda=0.0)
    calls = np.array([[x.tool_calls for x in g] for g in s.samples])
    errors = np.array([[x.tool_errors for x in g] for g in s.samples])
    assert calls.any() and errors.any()
    for bonus in (0.1, -0.1):
        adv, w = step_advantages(s, dataclasses.replace(m, tool_call_reward=bonus))
        want, want_w = obj.mgpo_advantages(s.rewards + bonus * calls, s.correct, m.gamma, m.adv_eps, m.std_ddof,
                                           s.valid)
        np.testing.assert_allclose(adv, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(w, want_w)
        assert not np.allclose(adv, step_advantages(s, m)[0])
    out = rollout_metrics(s, ["math"])
    assert out["tool_calls_mean"] == calls.mean()
    assert out["tool_calls_ok"] == ((calls > 0) & (errors == 0)).mean()
    assert out["response_len_mean"] == s.lengths.mean() < out["completion_len_mean"]
