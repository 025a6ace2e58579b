"""How sure an evaluation number is: 95% intervals for accuracies, ECE, losses and the gain of one model over another.

    wilson_interval(k, n)                      an accuracy k/n (Wilson score interval)
    bootstrap_ece_interval(conf, correct, ...) an ECE (percentile bootstrap over the questions, seeded)
    bootstrap_ratio_interval(num, den, ...)    sum(num) / sum(den) over resampled windows, e.g. nats per
                                               token (perplexity) or per byte (bits per byte), or a mean (Brier)
    bootstrap_interval(n, statistic, ...)      any statistic of n resampled items (AURC)
    paired_difference(correct_a, correct_b)    accuracy of b minus a on the same questions (Newcombe)

Wilson rather than the normal approximation because accuracies near 0 or 1 on a few hundred
questions are the normal case here, where p ± 1.96 sqrt(p(1-p)/n) leaves [0, 1] or shrinks to
nothing. Two models answer the *same* questions, so their accuracies are correlated; the
paired interval (Newcombe 1998, method 10) uses that correlation and is much narrower than two
separate intervals would suggest, which is what lets a small gain be told from noise.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from pydantic import BaseModel

from models.calibration import BinStrategy, ece_rows, prediction_arrays

LEVEL = 0.95
# Rows of resampled predictions held at once: bounds the bootstrap's memory to ~64 MB.
_BOOTSTRAP_CELLS = 4_000_000


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def wilson_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of the proportion k/n."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1 (k successes of n); got k={k}, n={n}")
    z2 = _z(level) ** 2
    p = k / n
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = math.sqrt(z2) * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    # At k = 0 (k = n) the bound is exactly 0 (1); rounding must not push it past.
    return (0.0 if k == 0 else max(0.0, center - half)), (1.0 if k == n else min(1.0, center + half))


def bootstrap_ece_interval(
    confidences, correct, n_bins: int = 15, strategy: BinStrategy = "uniform", resamples: int = 1000,
    seed: int = 0, level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the ECE: the questions resampled with replacement `resamples` times.

    ECE is biased upwards (|accuracy - confidence| of a bin is positive even when its expected
    value is 0), and a resample, with its repeated answers, more so: for well-calibrated answers
    the interval can lie wholly above the estimate. It then says the ECE is at the noise level
    of this many answers, which is what a reader needs to know before comparing two ECEs.
    """
    conf, corr = prediction_arrays(confidences, correct)  # what the ECE itself accepts
    values = _resampled(conf.size, resamples, seed, level, lambda idx: ece_rows(conf[idx], corr[idx], n_bins, strategy))
    return _percentiles(values, level)


def _resampled(n: int, resamples: int, seed: int, level: float, statistic) -> np.ndarray:
    """`statistic` of `resamples` bootstrap resamples of n items (index rows [k, n]), drawn in memory-bounded chunks."""
    if resamples < 2:
        raise ValueError(f"resamples must be >= 2, got {resamples}")
    _z(level)
    rng = np.random.default_rng(seed)
    chunk = max(1, _BOOTSTRAP_CELLS // n)
    values = [statistic(rng.integers(0, n, size=(min(chunk, resamples - start), n)))
              for start in range(0, resamples, chunk)]
    return np.concatenate(values)


def bootstrap_interval(n: int, statistic, resamples: int = 1000, seed: int = 0, level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic(indices)` (a number of n items resampled by index), e.g. an AURC."""
    values = _resampled(n, resamples, seed, level, lambda idx: np.array([statistic(row) for row in idx]))
    return _percentiles(values, level)


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def bootstrap_ratio_interval(
    numerators, denominators, resamples: int = 1000, seed: int = 0, level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(numerators) / sum(denominators), the pairs resampled together.

    For a loss, one pair per window of text (its nats, its tokens or bytes): the predictions of
    one window share their context, so it is the window, not the token, that is independent
    enough to resample (a block bootstrap). A resample whose denominators sum to 0 is left out.
    """
    num = np.asarray(numerators, dtype=np.float64).reshape(-1)
    den = np.asarray(denominators, dtype=np.float64).reshape(-1)
    if num.size < 2 or num.shape != den.shape:
        raise ValueError(f"need at least 2 (numerator, denominator) pairs of one length; got {num.size} and {den.size}")

    def ratios(idx: np.ndarray) -> np.ndarray:
        top, bottom = num[idx].sum(axis=1), den[idx].sum(axis=1)
        return top[bottom > 0] / bottom[bottom > 0]

    values = _resampled(num.size, resamples, seed, level, ratios)
    if values.size == 0:
        raise ValueError("every denominator is 0: nothing to take a ratio of (e.g. windows holding no text bytes)")
    return _percentiles(values, level)


class PairedDifference(BaseModel):
    """Accuracy of model b minus model a on the same questions, with its paired 95% interval."""

    n: int
    a_correct: int
    b_correct: int
    only_a: int  # questions a got right and b wrong
    only_b: int  # questions b got right and a wrong
    difference: float
    lo: float
    hi: float

    @property
    def significant(self) -> bool:
        """False when the interval contains 0: the data cannot tell the two models apart."""
        return not self.lo <= 0.0 <= self.hi

    def describe(self, a: str = "a", b: str = "b", scale: float = 100.0, unit: str = " pts") -> str:
        """E.g. `+1.2 pts [-0.8, +3.1], not significant: 5 questions right only by GRPO, 3 only by SFT` (a=SFT, b=GRPO)."""
        verdict = "significant" if self.significant else "not significant"
        return (f"{self.difference * scale:+.1f}{unit} [{self.lo * scale:+.1f}, {self.hi * scale:+.1f}], "
                f"{verdict}: {self.only_b} questions right only by {b}, {self.only_a} only by {a}")


def paired_difference(correct_a: Sequence[bool], correct_b: Sequence[bool], level: float = LEVEL) -> PairedDifference:
    """accuracy(b) - accuracy(a) over the same questions, with Newcombe's hybrid score interval (method 10).

    Each side is the Wilson interval of one marginal accuracy, combined with the correlation
    of the pairs (continuity-corrected phi, as in Newcombe 1998 and Altman et al. 2000).
    """
    a = np.asarray(correct_a, dtype=bool).reshape(-1)
    b = np.asarray(correct_b, dtype=bool).reshape(-1)
    if a.size == 0 or a.shape != b.shape:
        raise ValueError(f"need the same non-empty questions for both models; got {a.size} and {b.size} answers")
    n = int(a.size)
    both, only_b, only_a = int(np.sum(a & b)), int(np.sum(b & ~a)), int(np.sum(a & ~b))
    neither = n - both - only_a - only_b
    p1, p2 = (both + only_b) / n, (both + only_a) / n  # b's accuracy, a's accuracy
    l1, u1 = wilson_interval(both + only_b, n, level)
    l2, u2 = wilson_interval(both + only_a, n, level)
    margins = (both + only_b) * (only_a + neither) * (both + only_a) * (only_b + neither)
    phi = 0.0
    if margins > 0:
        cross = both * neither - only_b * only_a
        # Continuity correction: a positive association counts only beyond n/2.
        phi = (cross - n / 2.0 if cross > n / 2.0 else min(cross, 0)) / math.sqrt(margins)
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return PairedDifference(n=n, a_correct=both + only_a, b_correct=both + only_b, only_a=only_a, only_b=only_b,
                            difference=d, lo=max(-1.0, lo), hi=min(1.0, hi))


class Proportion(BaseModel):
    """`correct` of `n` right, with the Wilson 95% interval of the accuracy."""

    correct: int
    n: int
    accuracy: float
    accuracy_lo: float
    accuracy_hi: float

    def describe(self) -> str:
        """E.g. `36/59 (61.0% [48.3%, 72.4%])`."""
        return f"{self.correct}/{self.n} ({self.accuracy:.1%} [{self.accuracy_lo:.1%}, {self.accuracy_hi:.1%}])"


def proportion(correct: Sequence[bool]) -> Proportion:
    """How many of `correct` are true, with the Wilson interval of the share."""
    return proportion_of(int(sum(bool(c) for c in correct)), len(correct))


def proportion_of(k: int, n: int) -> Proportion:
    """`k` right of `n`, with the Wilson interval of the share."""
    lo, hi = wilson_interval(k, n)
    return Proportion(correct=k, n=n, accuracy=k / n, accuracy_lo=lo, accuracy_hi=hi)
