"""Packed rows and token-budget micro-batches in the RL learner (issue 18): the same update as the padded rows."""

import numpy as np
import pytest

from packed_check import G, Q, check, config, make_scored, row_length
from vt.data.packing import first_fit_rows, pack_lengths, packed_rows
from vt.rl.rollouts import build_rows, per_token, sample_lengths


def test_pack_lengths_first_fit_decreasing():
    lengths = [5, 3, 8, 2, 7, 1, 4]
    rows = pack_lengths(lengths, 8)
    sample = rows["sample"]
    assert sample.shape == (4, 8)  # 30 tokens: 8 | 7 1 | 5 3 | 4 2, the optimum (arrival order would take 5)
    for i, n in enumerate(lengths):  # every sequence whole, in one row, positions restarting at 0
        r, t = np.nonzero(sample == i)
        assert len(t) == n and len(set(r)) == 1 and list(rows["positions"][r, t]) == list(range(n))
        assert len(set(rows["segment_ids"][r, t])) == 1 and rows["segment_ids"][r[0], t[0]] > 0
    assert np.all((sample < 0) == (rows["segment_ids"] == 0))
    with pytest.raises(ValueError, match="lengths must be in"):
        pack_lengths([9], 8)


def test_pack_lengths_places_as_grains_first_fit_packer():
    """The same rows, slot for slot, as grain's FirstFitPackIterDataset (longest first, enough bins that none is
    flushed, bins in order), which pack_lengths replaced on the host's hot path."""
    import grain
    from grain.experimental import FirstFitPackIterDataset

    rng = np.random.default_rng(0)
    for case in range(60):
        T = int(rng.integers(4, 64))
        lengths = (rng.integers(1, T + 1, int(rng.integers(1, 80))) if case % 2 else
                   np.minimum(T, rng.lognormal(1.0, 1.0, int(rng.integers(1, 80))).astype(int) + 1))
        order = np.argsort(-lengths, kind="stable")
        source = [{"sample": np.full(lengths[i], i, np.int32)} for i in order]
        rows = list(FirstFitPackIterDataset(grain.MapDataset.source(source).to_iter_dataset(),
                                            length_struct={"sample": T}, num_packing_bins=len(lengths),
                                            shuffle_bins=False, padding_struct={"sample": -1}))
        ours = pack_lengths(lengths, T)
        for key, theirs in (("sample", "sample"), ("segment_ids", "sample_segment_ids"),
                            ("positions", "sample_positions")):
            np.testing.assert_array_equal(ours[key], np.stack([r[theirs] for r in rows]), err_msg=f"{case} {key}")


def test_packed_rows_hold_the_padded_rows_tokens():
    s = make_scored()
    T = row_length(s)
    padded, packed = build_rows(s, T, pack=False), build_rows(s, T, pack=True)
    n = sample_lengths(s, T)
    assert len(padded["input_ids"]) == Q * G
    assert len(packed["input_ids"]) <= -(-n.sum() * 11 // (9 * T)) + 1  # first fit decreasing's bound
    for i in range(Q * G):
        a, b = padded["sample"] == i, packed["sample"] == i
        assert a.sum() == b.sum() == n[i]
        for k in ("input_ids", "targets", "loss_mask", "sampler_logp", "positions"):
            np.testing.assert_array_equal(padded[k][a], packed[k][b], err_msg=k)
    values = np.arange(Q * G, dtype=np.float32) + 1
    np.testing.assert_array_equal(per_token(values, packed["sample"]), np.where(packed["sample"] >= 0,
                                                                                packed["sample"] + 1, 0))


def scored_lengths(lengths, Q: int, G: int):
    """A Scored of Q groups of G samples whose rows take `lengths` slots each (a 1-token prompt, len(completion)
    slots)."""
    from vt.rl.rollouts import Scored
    from vt.sampling.engine import Sample

    samples = [[Sample([7] * int(n), [-1.0] * int(n), "stop") for n in lengths[q * G:(q + 1) * G]] for q in range(Q)]
    return Scored([[5]] * Q, samples, correct=np.zeros((Q, G), bool), rewards=np.zeros((Q, G), np.float32),
                  valid=np.ones((Q, G), bool), lengths=np.asarray(lengths).reshape(Q, G),
                  truncated=np.zeros((Q, G), bool), domains=["math"] * Q)


def test_row_length_packs_samples_just_over_a_bucket_two_by_two():
    """Samples of 15 slots and one of 17. The bucketed longest, 24, holds one sample a row; rows of 32 hold two
    (half the rows, a third fewer slots), so the learner packs at 32. All samples of 15: rows of 16 and of 32
    compute as many slots; attention is cheaper at 16. Not packed: the bucketed longest. packed_rows counts
    pack_lengths' rows."""
    from vt.model.config import preset
    from vt.rl.batches import row_length as learner_row_length
    from vt.sharding import MeshConfig, make_mesh

    cfg, mesh = preset("tiny"), make_mesh(MeshConfig())

    def choice(lengths, pack=True):
        return learner_row_length(scored_lengths(lengths, Q, G), cfg, pack, 65536, mesh)

    lengths = np.full(Q * G, 15)
    lengths[5] = 17
    assert (packed_rows(lengths, 24), packed_rows(lengths, 32)) == (Q * G, Q * G // 2)
    assert choice(lengths) == 32
    assert choice(lengths, pack=False) == 24
    assert choice(np.full(Q * G, 15)) == 16
    rng = np.random.default_rng(0)
    for T in (8, 13, 64):
        n = rng.integers(1, T + 1, 50)
        assert packed_rows(n, T) == len(pack_lengths(n, T)["sample"])
        placed = [[int(i) for i in dict.fromkeys(row[row >= 0])] for row in pack_lengths(n, T)["sample"]]
        assert first_fit_rows(n, T) == placed  # the same rows, in the same order


def test_row_length_counts_the_rows_the_micro_batch_computes():
    """bench/rl_step.py's toy step: 125 samples of 15 slots, two of 16, one of 18. Rows of 32 hold two of them
    (the 18 alone): 65 rows, which the micro-batch rounds up to 96 (3,072 slots); rows of 48 hold three: 43 rows,
    rounded to 48 (2,304 slots). First-fit's rows alone favour 32 (2,080 vs 2,064 slots, attention dearer at
    48); the rows computed favour 48. A micro-batch that would be full either way keeps the shorter rows."""
    from vt.model.config import preset
    from vt.rl.batches import micro_batch_sizes, row_length as learner_row_length
    from vt.sharding import MeshConfig, make_mesh

    cfg, mesh = preset("tiny"), make_mesh(MeshConfig())
    lengths = np.array([15] * 125 + [16, 16, 18])
    assert (packed_rows(lengths, 32), packed_rows(lengths, 48)) == (65, 43)
    assert micro_batch_sizes(32, 65, 65536, mesh) == [96] and micro_batch_sizes(48, 43, 65536, mesh) == [48]
    assert 65 * 32 * cfg.flops_per_token(32) < 43 * 48 * cfg.flops_per_token(48)
    assert learner_row_length(scored_lengths(lengths, 16, 8), cfg, True, 65536, mesh) == 48
    # micro-batches of 8 rows of 32 or 5 of 48 compute first-fit's rows (2,080 vs 2,064 slots): 32, as above
    assert micro_batch_sizes(32, 65, 256, mesh) == [8] * 8 + [1]
    assert micro_batch_sizes(48, 43, 256, mesh) == [5] * 8 + [3]
    assert learner_row_length(scored_lengths(lengths, 16, 8), cfg, True, 256, mesh) == 32


def test_shared_rows_hold_each_prompt_once_and_every_completion_as_it_was():
    """build_rows(share=True): every sample's completion slots (inputs, targets, rotary positions, sampler
    log-probs, in order) are those of the unshared rows; each unit's prompt slots are the prompt less its last
    token at positions 0.., once, its completions branches s + j * BRANCH of its segment s; fewer slots in all."""
    from vt.model.segments import BRANCH
    s = make_scored(seed=3, Q=6, G=5)
    T = row_length(s)
    plain, shared = build_rows(s, T, pack=True), build_rows(s, T, pack=True, share=True)
    fields = ("input_ids", "targets", "positions", "sampler_logp")
    for i in range(6 * 5):
        mine = [(plain["sample"] == i) & (plain["loss_mask"] > 0), (shared["sample"] == i) & (shared["loss_mask"] > 0)]
        for f in fields:
            np.testing.assert_array_equal(plain[f][mine[0]], shared[f][mine[1]], err_msg=f"sample {i} {f}")
        assert mine[1].sum() == s.lengths.reshape(-1)[i]
    prompts = [len(p) - 1 for p in s.prompts]
    units = 0
    for r in range(len(shared["input_ids"])):
        seg = shared["segment_ids"][r]
        for doc in sorted(set(seg[(seg > 0) & (seg < BRANCH)].tolist())):
            branches = sorted(set(seg[seg % BRANCH == doc].tolist()) - {doc})
            if not branches:
                continue
            units += 1
            pre = seg == doc
            q = shared["sample"][r][seg == branches[0]][0] // 5
            assert pre.sum() == prompts[q] and (shared["sample"][r][pre] == -1).all()
            np.testing.assert_array_equal(shared["input_ids"][r][pre], s.prompts[q][:-1])
            np.testing.assert_array_equal(shared["positions"][r][pre], np.arange(prompts[q]))
            assert branches == [doc + j * BRANCH for j in range(1, len(branches) + 1)]
            assert not shared["loss_mask"][r][pre].any()
    assert units > 0
    assert np.count_nonzero(shared["segment_ids"]) < np.count_nonzero(plain["segment_ids"])
    assert (shared["sample"][shared["loss_mask"] > 0] >= 0).all()


def test_row_length_with_shared_prompts_fits_a_group_in_a_row():
    """The toy step shared: 16 groups of 8 samples, 11-token prompts, 5-token completions (15 slots a sample
    alone: rows of 16, 2,048 slots). Shared, half a group fills a row of 32 (10 + 4 x 5) and a whole one 50 slots
    of a row of 64: 1,024 slots either way, and attention is cheaper at 32."""
    from vt.model.config import preset
    from vt.rl.batches import row_length as learner_row_length
    from vt.rl.rollouts import Scored
    from vt.sampling.engine import Sample
    from vt.sharding import MeshConfig, make_mesh

    Q_, G_ = 16, 8
    samples = [[Sample([7] * 5, [-1.0] * 5, "stop") for _ in range(G_)] for _ in range(Q_)]
    s = Scored([[5] * 11] * Q_, samples, correct=np.zeros((Q_, G_), bool), rewards=np.zeros((Q_, G_), np.float32),
               valid=np.ones((Q_, G_), bool), lengths=np.full((Q_, G_), 5), truncated=np.zeros((Q_, G_), bool),
               domains=["math"] * Q_)
    cfg, mesh = preset("tiny"), make_mesh(MeshConfig())
    assert learner_row_length(s, cfg, True, 65536, mesh) == 16
    assert learner_row_length(s, cfg, True, 65536, mesh, share=True) == 32
    rows = build_rows(s, 32, share=True)
    assert rows["input_ids"].shape == (32, 32) and np.count_nonzero(rows["segment_ids"]) == 32 * 30
    rows = build_rows(s, 64, share=True)
    assert rows["input_ids"].shape == (16, 64) and np.count_nonzero(rows["segment_ids"]) == 16 * 50


def test_mini_batches_keep_whole_groups_and_must_divide_them():
    from vt import VtError
    from vt.rl.batches import learner_batches
    from vt.sharding import MeshConfig, make_mesh
    s, mesh = make_scored(), make_mesh(MeshConfig())
    adv = np.ones((Q, G), np.float32)
    T = row_length(s)
    batches, groups, tokens = learner_batches(s, adv, T, 3, config("seq_mean", True, 128, mini_batches=2), mesh)
    assert len(batches) == 2 and sorted(np.concatenate(groups).tolist()) == list(range(Q))
    assert all(len(g) == Q // 2 for g in groups)
    # a mini-batch's rows hold exactly its groups' tokens
    real = [sum(int(np.count_nonzero(np.asarray(mb["segment_ids"]))) for mb in micro) for micro in batches]
    n = sample_lengths(s, T).reshape(Q, G).sum(1)
    assert real == [int(n[g].sum()) for g in groups]
    assert tokens["tokens_real"] == n.sum() and tokens["tokens_computed"] >= n.sum()
    with pytest.raises(VtError, match=r"mgpo.mini_batches=3 must divide the prompt groups"):
        learner_batches(s, adv, T, 3, config("seq_mean", True, 128, mini_batches=3), mesh)


def test_packed_and_padded_updates_equal_on_one_device():
    """fp32: loss to 1e-6 relative, every gradient tensor to 1e-5 of its largest entry, for both aggregations,
    with KL, Long2Short, truncated IS weights and pi_old != pi; several micro-batches (128-token budget); rows
    packed with and without shared prompts."""
    r = check()
    assert r["bad"] == [], "\n".join(r["bad"])
    t = r["tokens"]
    assert t["seq_mean, packed"]["tokens_computed"] < t["seq_mean, padded"]["tokens_computed"]
    # shared prompts: some completions are branches, and the rows hold fewer real slots than the samples' sum
    assert t["seq_mean, shared"]["branches"] > 0 and t["seq_mean, packed"]["branches"] == 0
    assert t["seq_mean, shared"]["tokens_real"] < t["seq_mean, packed"]["tokens_real"]
    assert min(r["micro_batches"].values()) > 1


@pytest.mark.devices(8)
def test_packed_and_padded_updates_equal_on_the_8_device_mesh():
    r = check((2, 2, 2))
    assert r["bad"] == [], "\n".join(r["bad"])
    assert min(r["micro_batches"].values()) > 1


def test_long_tail_step_computes_at_most_15_percent_more_tokens_than_it_has():
    """128 completions, log-normal lengths with median 1/16 of a 1024-slot window, 2 at the window (the workload
    of bench/rl_step.py --long-tail): packed rows and a 4096-slot micro-batch budget compute <= 1.15x the real
    tokens; one padded row per sample computes several times more (the ratio of the longest row to the mean)."""
    from vt.rl.batches import learner_batches
    from vt.rl.rollouts import Scored
    from vt.sampling.engine import Sample
    from vt.sharding import MeshConfig, make_mesh
    rng = np.random.default_rng(0)
    Q, G, room = 16, 8, 1024 - 16
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(room / 16), 1.0, Q * G))), 1, room).astype(int)
    lengths[:2] = room
    samples = [[Sample([7] * int(n), [-1.0] * int(n), "stop") for n in lengths[q * G:(q + 1) * G]] for q in range(Q)]
    s = Scored([[5] * 16] * Q, samples, correct=np.zeros((Q, G), bool), rewards=np.zeros((Q, G), np.float32),
               valid=np.ones((Q, G), bool), lengths=lengths.reshape(Q, G), truncated=np.zeros((Q, G), bool),
               domains=["math"] * Q)
    mesh, adv = make_mesh(MeshConfig()), np.zeros((Q, G), np.float32)
    packed = learner_batches(s, adv, 1024, 0, config("seq_mean", True, 4096), mesh)[2]
    padded = learner_batches(s, adv, 1024, 0, config("seq_mean", False, 4096), mesh)[2]
    assert packed["tokens_real"] == padded["tokens_real"] == (lengths + 15).sum()
    assert packed["tokens_computed"] / packed["tokens_real"] <= 1.15, packed
    assert padded["tokens_computed"] / padded["tokens_real"] > 4, padded


def test_one_micro_batch_update_is_one_program_equal_to_the_accumulated_update():
    """A mini-batch of one micro-batch runs as the fused program (zeros + accumulate + apply in one): the same
    new parameters (to 1e-6 of each tensor's largest entry) and metrics as the three programs it replaces."""
    import jax
    from packed_check import Setup
    from vt.rl.batches import learner_batches, step_advantages
    from vt.sharding import MeshConfig, make_mesh
    from vt.train.state import init_train_state

    mesh = make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1])
    setup = Setup(mesh)
    s, cfg = make_scored(), config("seq_mean", True, 1 << 16)
    (micro,), _, _ = learner_batches(s, step_advantages(s, cfg.mgpo)[0], row_length(s), 0, cfg, mesh)
    assert len(micro) == 1
    mb = micro[0]
    inputs = {k: mb[k] for k in ("input_ids", "targets", "positions", "segment_ids")}
    mb["old_logp"], mb["ref_logp"] = setup.logps(setup.old_params, inputs), setup.logps(setup.ref_params, inputs)
    progs = setup.step.programs

    def fresh():
        return init_train_state(jax.tree.map(jax.numpy.copy, setup.params), setup.optimizer, setup.shardings)

    fused, fused_metrics = setup.step(fresh(), micro)
    assert len(progs["update_one"]._compiled) == 1 and not progs["accumulate"]._compiled
    state = fresh()
    split, split_metrics = progs["apply"](state, progs["accumulate"](state.params, progs["zeros"](state.params), mb))
    fused_metrics, split_metrics = jax.device_get((fused_metrics, split_metrics))
    assert fused_metrics.keys() == split_metrics.keys()
    for k in fused_metrics:
        assert np.allclose(fused_metrics[k], split_metrics[k], rtol=1e-6, atol=0), k
    for k, new in jax.device_get(fused.params).items():
        ref, before = np.asarray(jax.device_get(split.params[k])), np.asarray(jax.device_get(setup.params[k]))
        assert not np.array_equal(ref, before), k  # the update moved every tensor
        assert np.abs(new - ref).max() <= 1e-6 * np.abs(ref).max(), k
