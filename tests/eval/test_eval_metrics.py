"""pass@k against brute-force enumeration, avg@n, maj@k with its tie policy, truncation and length."""
import itertools
import math

import numpy as np
import pytest

from vt import VtError
from vt.eval import metrics as M


def brute_pass_at_k(n, c, k):
    """Fraction of the C(n, k) subsets of k samples that hold at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert M.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_formula_large_n_stable():
    # The binomial form in exact integers vs the product form: no overflow, ~1e-15 agreement.
    for n, c, k in [(64, 1, 32), (64, 3, 64), (256, 10, 128), (1024, 5, 512), (64, 0, 1), (64, 64, 1)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert M.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)
    assert M.pass_at_k(64, 8, 1) == pytest.approx(8 / 64)  # pass@1 = c / n


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(VtError):
            M.pass_at_k(n, c, k)


def test_pass_at_k_same_as_train_selection_when_present():
    sel = pytest.importorskip("vt.train.selection")
    for n, c, k in [(8, 2, 3), (16, 0, 4), (16, 15, 2)]:
        assert sel.pass_at_k(n, c, k) == pytest.approx(M.pass_at_k(n, c, k))


def test_avg_truncation_length():
    assert M.avg_at_n([True, False, True, True]) == 0.75
    assert M.truncation_rate(["stop", "length", "stop", "length"]) == 0.5
    assert M.mean_length([10, 20, 30]) == 20.0


def test_cluster_answers_whitespace_and_equivalence():
    answers = ["\\frac{1}{2}", "3", None, "\\frac {1} {2}", "0.5", "4"]
    assert M.cluster_answers(answers) == [0, 1, None, 0, 2, 3]
    eq = lambda a, b: {M.normalize_answer(a), M.normalize_answer(b)} <= {"\\frac{1}{2}", "0.5"}  # noqa: E731
    assert M.cluster_answers(answers, eq) == [0, 1, None, 0, 0, 2]


def test_maj_at_k_hand_cases():
    # answers:  A  B  B  A  C  B ; A is correct
    clusters = [0, 1, 1, 0, 2, 1]
    correct = [True, False, False, True, False, False]
    assert M.maj_at_k(clusters, correct, 1) == 1.0  # only A
    assert M.maj_at_k(clusters, correct, 3) == 0.0  # B 2 : A 1
    assert M.maj_at_k(clusters, correct, 6) == 0.0  # B 3 : A 2


def test_maj_tie_policy_earliest_cluster_wins():
    # A B A B: tie 2-2, A appears first -> A (correct here); B A B A -> B.
    assert M.maj_at_k([0, 1, 0, 1], [True, False, True, False], 4) == 1.0
    assert M.maj_at_k([0, 1, 0, 1], [False, True, False, True], 4) == 0.0
    # unanswered samples do not vote, even when they are the most common "answer"
    assert M.maj_at_k([None, None, None, 0], [False, False, False, True], 4) == 1.0
    assert M.maj_at_k([None, None], [False, False], 2) == 0.0


def test_weighted_vote_tie_breaks():
    # equal weight sums: more members wins, then first appearance
    assert M.weighted_vote([0, 1, 1], [1.0, 0.5, 0.5]) == 1
    assert M.weighted_vote([0, 1], [0.0, 0.0]) == 0
    assert M.weighted_vote([0, 1, 1, 0], [0.1, 0.9, 0.0, 0.2]) == 1


def test_problem_metrics_and_mean():
    m = M.problem_metrics([True, False, False, True], [0, 1, 1, 0], ["stop", "stop", "length", "stop"],
                          [4, 6, 10, 4], ks=(1, 2, 8), maj_ks=(4,))
    assert m["avg@n"] == 0.5 and m["pass@2"] == pytest.approx(1 - 1 / 6) and "pass@8" not in m
    assert m["maj@4"] == 1.0 and m["truncated"] == 0.25 and m["mean_tokens"] == 6.0
    agg = M.mean_over_problems([{"avg@n": 1.0, "pass@2": 1.0}, {"avg@n": 0.0}])
    assert agg == {"problems": 2, "avg@n": 0.5, "pass@2": 1.0}
    assert np.isfinite(list(agg.values())).all()
