"""Intervals against textbook values, a reference implementation and simulation."""
from __future__ import annotations

import numpy as np
import pytest

from models.calibration import ece, ece_rows
from tasks.eval.intervals import (bootstrap_ece_interval, bootstrap_ratio_interval, paired_difference, proportion,
                                  wilson_interval)


def test_wilson_matches_the_textbook_values() -> None:
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I (method 3).
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=5e-5)
    assert wilson_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=5e-5)
    # The 32/59, by the formula: centre (p + z²/2n) / (1 + z²/n), half-width z sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n).
    z, n, p = 1.959963984540054, 59, 32 / 59
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_interval(32, 59) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert wilson_interval(32, 59) == pytest.approx((0.4166, 0.6630), abs=5e-5)
    assert wilson_interval(59, 59)[1] == 1.0 and wilson_interval(0, 59)[0] == 0.0


def test_wilson_agrees_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    for k, n in ((0, 1), (1, 1), (3, 10), (46, 524), (500, 524)):
        ref = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ref.low, ref.high), abs=1e-12)
    ref = scipy_stats.binomtest(7, 40).proportion_ci(confidence_level=0.9, method="wilson")
    assert wilson_interval(7, 40, level=0.9) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_wilson_refuses_impossible_counts() -> None:
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError, match="k successes of n"):
            wilson_interval(k, n)
    with pytest.raises(ValueError, match="level"):
        wilson_interval(1, 2, level=1.5)


def test_proportion_describes_count_rate_and_interval() -> None:
    p = proportion([True] * 32 + [False] * 27)
    assert (p.correct, p.n) == (32, 59) and p.accuracy == pytest.approx(32 / 59)
    assert p.describe() == "32/59 (54.2% [41.7%, 66.3%])"


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_ece_rows_bins_each_row_like_ece(strategy: str) -> None:
    rng = np.random.default_rng(0)
    conf = rng.uniform(0, 1, (6, 97)) ** 0.5
    conf[0, :40] = 0.7  # ties, which equal-mass bins split by rank
    correct = rng.uniform(size=conf.shape) < conf**2
    rows = ece_rows(conf, correct, 10, strategy)
    for r in range(conf.shape[0]):
        assert rows[r] == pytest.approx(ece(conf[r], correct[r], 10, strategy), abs=1e-12)
    with pytest.raises(ValueError, match=r"\[R, N\]"):
        ece_rows(conf[0], correct[0])


def test_bootstrap_ece_interval_is_seeded_and_shrinks_with_more_answers() -> None:
    rng = np.random.default_rng(1)

    def sample(n: int):
        conf = rng.uniform(0.3, 1.0, n)
        return conf, rng.uniform(size=n) < conf - 0.1  # overconfident by 0.1

    conf, correct = sample(300)
    lo, hi = bootstrap_ece_interval(conf, correct, 10, "quantile", resamples=500, seed=3)
    assert (lo, hi) == bootstrap_ece_interval(conf, correct, 10, "quantile", resamples=500, seed=3)
    assert (lo, hi) != bootstrap_ece_interval(conf, correct, 10, "quantile", resamples=500, seed=4)
    assert lo < ece(conf, correct, 10, "quantile") < hi
    assert lo < 0.1 < hi + 0.05  # the true gap (ECE is biased upwards on few answers)
    big_conf, big_correct = sample(5000)
    big_lo, big_hi = bootstrap_ece_interval(big_conf, big_correct, 10, "quantile", resamples=200, seed=3)
    assert big_hi - big_lo < (hi - lo) / 2
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ece_interval([], [])


def test_bootstrap_ratio_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    # Windows of 20..60 tokens whose nats per token scatter around 2.0 (window to window, as a
    # text's topics do): the interval of sum(nats) / sum(tokens) should hold 2.0 about 95% of the time.
    rng = np.random.default_rng(0)
    hits = 0
    for rep in range(200):
        tokens = rng.integers(20, 61, size=40).astype(float)
        nats = tokens * rng.normal(2.0, 0.3, size=40)
        lo, hi = bootstrap_ratio_interval(nats, tokens, resamples=400, seed=rep)
        assert lo <= nats.sum() / tokens.sum() <= hi
        hits += lo <= 2.0 <= hi
    assert 0.88 <= hits / 200 <= 0.99


def test_bootstrap_ratio_interval_is_seeded_and_refuses_what_it_cannot_resample() -> None:
    nats, tokens = np.array([3.0, 5.0, 9.0, 4.0]), np.array([2.0, 2.0, 4.0, 2.0])
    assert bootstrap_ratio_interval(nats, tokens, 200, seed=1) == bootstrap_ratio_interval(nats, tokens, 200, seed=1)
    assert bootstrap_ratio_interval(tokens * 2.5, tokens, 200) == pytest.approx((2.5, 2.5))  # no spread, no width
    # A resample of only the 0-byte window has no ratio: it is left out, not a division by zero.
    lo, hi = bootstrap_ratio_interval([1.0, 0.0], [2.0, 0.0], 200)
    assert lo == hi == 0.5
    with pytest.raises(ValueError, match="at least 2"):
        bootstrap_ratio_interval([1.0], [1.0])
    with pytest.raises(ValueError, match="every denominator is 0"):
        bootstrap_ratio_interval([1.0, 2.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_ratio_interval(nats, tokens, resamples=1)


def test_paired_difference_matches_the_reference_implementation() -> None:
    # Cavo et al. (2012) in Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", ch. 8:
    # table [[59, 6], [16, 80]], Newcombe square-and-add interval -0.0621 (-0.1186 to -0.0046).
    both, only_first, only_second, neither = 59, 6, 16, 80
    first = [1] * both + [1] * only_first + [0] * only_second + [0] * neither
    second = [1] * both + [0] * only_first + [1] * only_second + [0] * neither
    d = paired_difference(correct_a=second, correct_b=first)
    assert d.difference == pytest.approx(-0.0621, abs=5e-5)
    assert (d.lo, d.hi) == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    assert (d.n, d.only_b, d.only_a, d.b_correct, d.a_correct) == (161, 6, 16, 65, 75)
    assert d.significant and "significant: 6 questions right only by b, 16 only by a" in d.describe()
    swapped = paired_difference(correct_a=first, correct_b=second)
    assert (swapped.lo, swapped.hi) == pytest.approx((-d.hi, -d.lo), abs=1e-12)


def test_paired_difference_of_equal_models_is_not_significant() -> None:
    same = [True] * 40 + [False] * 60
    d = paired_difference(same, same)
    assert d.difference == 0.0 and d.lo <= 0.0 <= d.hi and not d.significant
    assert d.describe().startswith("+0.0 pts") and "not significant" in d.describe()
    # The case: 32/59 -> 33/59 with a few questions changing hands is noise.
    a = [True] * 32 + [False] * 27
    b = [True] * 30 + [False] * 2 + [True] * 3 + [False] * 24
    noisy = paired_difference(a, b)
    assert noisy.difference == pytest.approx(1 / 59) and not noisy.significant
    with pytest.raises(ValueError, match="same non-empty questions"):
        paired_difference([True], [True, False])


def test_paired_interval_covers_like_a_paired_bootstrap_and_beats_unpaired_intervals() -> None:
    rng = np.random.default_rng(5)
    skill = rng.uniform(size=500)  # questions differ in difficulty: the two models' answers correlate
    a = rng.uniform(size=500) < skill
    b = rng.uniform(size=500) < np.clip(skill + 0.05, 0, 1)
    d = paired_difference(a, b)
    idx = rng.integers(0, 500, (4000, 500))
    boot = b[idx].mean(axis=1) - a[idx].mean(axis=1)
    ref_lo, ref_hi = np.quantile(boot, [0.025, 0.975])
    assert d.lo == pytest.approx(ref_lo, abs=0.01) and d.hi == pytest.approx(ref_hi, abs=0.01)
    # Pairing uses the correlation: narrower than the difference of two separate Wilson intervals.
    wa, wb = wilson_interval(int(a.sum()), 500), wilson_interval(int(b.sum()), 500)
    assert d.hi - d.lo < (wb[1] - wa[0]) - (wb[0] - wa[1])
