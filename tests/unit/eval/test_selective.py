"""Selective prediction: accuracy-coverage curve, AURC and the target threshold, by hand."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.eval.selective import accuracy_coverage, aurc, optimal_aurc, selective_report


def test_accuracy_coverage_by_hand() -> None:
    conf = [0.9, 0.8, 0.8, 0.3, 0.6]
    correct = [1, 1, 0, 0, 1]
    t, cov, acc = accuracy_coverage(conf, correct)
    # Thresholds at each distinct confidence, highest first; a tie enters as a whole.
    assert t.tolist() == [0.9, 0.8, 0.6, 0.3]
    assert cov.tolist() == pytest.approx([1 / 5, 3 / 5, 4 / 5, 1.0])
    assert acc.tolist() == pytest.approx([1.0, 2 / 3, 3 / 4, 3 / 5])


def test_aurc_by_hand_without_ties() -> None:
    conf = [0.9, 0.7, 0.5, 0.2]
    correct = [1, 0, 1, 0]
    # Risk of the first 1, 2, 3, 4 answers: 0, 1/2, 1/3, 2/4.
    assert aurc(conf, correct) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4)
    # The best ranking puts both right answers first: risks 0, 0, 1/3, 2/4.
    assert optimal_aurc(correct) == pytest.approx((0 + 0 + 1 / 3 + 2 / 4) / 4)


def test_aurc_takes_ties_in_expectation() -> None:
    correct = np.array([1, 0, 1, 1, 0, 0, 1, 0], dtype=bool)
    # One confidence for all: no ranking at all, the risk is the error rate at every coverage.
    assert aurc(np.full(8, 0.5), correct) == pytest.approx(0.5)
    # A tie scores the mean over its orderings, so it does not depend on the order of the input.
    conf = np.array([0.9, 0.5, 0.5, 0.5, 0.2, 0.9, 0.5, 0.1])
    perm = np.random.default_rng(0).permutation(8)
    assert aurc(conf, correct) == pytest.approx(aurc(conf[perm], correct[perm]))
    # ... and equals the average over every ordering of the tied answers, broken by a tiny jitter.
    rng = np.random.default_rng(1)
    jittered = [aurc(conf + rng.uniform(0, 1e-6, 8) * (conf == 0.5), correct) for _ in range(4000)]
    assert aurc(conf, correct) == pytest.approx(np.mean(jittered), abs=3e-3)


def test_a_perfect_ranking_has_no_excess_aurc() -> None:
    correct = np.array([1, 1, 1, 0, 0])
    good = selective_report([0.9, 0.8, 0.7, 0.2, 0.1], correct)
    assert good.e_aurc == pytest.approx(0.0, abs=1e-12)
    bad = selective_report([0.1, 0.2, 0.3, 0.8, 0.9], correct)  # wrong answers most confident
    assert bad.aurc > 1 - correct.mean() > good.aurc


def test_threshold_that_reaches_the_target_accuracy() -> None:
    conf = [0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1]
    correct = [1, 1, 1, 1, 0, 1, 1, 0, 0, 0]
    r = selective_report(conf, correct, target_accuracy=0.8)
    # conf >= 0.4: 7 answered, 6 right (0.857); conf >= 0.3: 6/8 = 0.75 < 0.8.
    assert r.threshold_at_target == 0.4 and r.answered_at_target == 7
    assert r.coverage_at_target == pytest.approx(0.7) and r.accuracy_at_target == pytest.approx(6 / 7)
    assert r.accuracy_at_target_lo < 6 / 7 < r.accuracy_at_target_hi
    assert r.curve_coverage[-1] == 1.0 and r.curve_accuracy[-1] == pytest.approx(0.6)
    strict = selective_report(conf, correct, target_accuracy=1.0)
    assert strict.threshold_at_target == 0.8 and strict.answered_at_target == 4
    never = selective_report(conf, [0] * 10, target_accuracy=0.5)
    assert never.threshold_at_target is None and never.coverage_at_target is None


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        aurc([], [])
    with pytest.raises(ValueError, match="0/1"):
        aurc([0.5], [2])
    with pytest.raises(ValueError, match="target_accuracy"):
        selective_report([0.5], [1], target_accuracy=0.0)
