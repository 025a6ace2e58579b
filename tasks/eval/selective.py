"""Selective prediction, what calibration is for: answer only when the confidence is at least t.

    selective_report(conf, correct, target_accuracy)   the accuracy-coverage curve, AURC, and
                                                       the threshold that reaches the target

Raising t answers fewer questions (coverage) and, for a model whose confidence ranks its
answers well, more of them right. AURC is the area under the risk-coverage curve (risk =
1 - accuracy of the answered part; Geifman et al. 2018): the mean risk over coverages
1/n, 2/n, ..., 1 with answers taken most-confident first. Ties in confidence cannot be ranked,
so within a tie the expected risk over its orderings is used. Lower is better; a ranking no
better than chance scores the error rate, and E-AURC subtracts the best any ranking of the
same answers could score.
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from models.calibration import prediction_arrays
from tasks.eval.intervals import wilson_interval


class SelectiveReport(BaseModel):
    """The accuracy-coverage curve of a set of answers, its AURC, and the threshold reaching `target_accuracy`."""

    aurc: float
    aurc_lo: float | None = None  # percentile bootstrap 95% interval over the answers
    aurc_hi: float | None = None
    e_aurc: float  # aurc minus the best AURC of a ranking that puts every right answer first
    target_accuracy: float
    # The lowest threshold whose answered part is at least target_accuracy right (largest coverage);
    # None when no threshold reaches it. Chosen on these same answers, so optimistic for new ones.
    threshold_at_target: float | None = None
    coverage_at_target: float | None = None
    answered_at_target: int | None = None
    accuracy_at_target: float | None = None
    accuracy_at_target_lo: float | None = None  # Wilson 95% interval of accuracy_at_target
    accuracy_at_target_hi: float | None = None
    # One point per distinct confidence, highest first: answer when confidence >= threshold.
    curve_threshold: list[float]
    curve_coverage: list[float]
    curve_accuracy: list[float]


def accuracy_coverage(confidences, correct) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(threshold, coverage, accuracy) at each distinct confidence, highest first: answering when confidence >= threshold."""
    conf, corr = prediction_arrays(confidences, correct, probabilities=False)
    order = np.argsort(-conf, kind="stable")
    c, right = conf[order], corr[order]
    last = np.r_[np.flatnonzero(np.diff(c) != 0), c.size - 1]  # the last answer of each tie group
    answered = last + 1
    return c[last], answered / c.size, np.cumsum(right)[last] / answered


def aurc(confidences, correct) -> float:
    """Area under the risk-coverage curve, ties in confidence taken in expectation over their orderings."""
    conf, corr = prediction_arrays(confidences, correct, probabilities=False)
    order = np.argsort(-conf, kind="stable")
    c, err = conf[order], 1.0 - corr[order]
    n = c.size
    starts = np.r_[0, np.flatnonzero(np.diff(c) != 0) + 1]
    sizes = np.diff(np.r_[starts, n])
    group_err = np.add.reduceat(err, starts)
    before = np.r_[0.0, np.cumsum(group_err)[:-1]]
    group = np.repeat(np.arange(starts.size), sizes)
    within = np.arange(n) - starts[group] + 1
    # Expected errors among the first i answers: a tie's errors spread evenly over its places.
    expected_errors = before[group] + within * group_err[group] / sizes[group]
    return float(np.mean(expected_errors / np.arange(1, n + 1)))


def optimal_aurc(correct) -> float:
    """The AURC of a confidence that ranks every right answer above every wrong one."""
    corr = np.asarray(correct, dtype=np.float64).reshape(-1)
    if corr.size == 0:
        raise ValueError("need at least one answer")
    i = np.arange(1, corr.size + 1)
    return float(np.mean(np.maximum(0.0, i - corr.sum()) / i))


def selective_report(confidences, correct, target_accuracy: float = 0.9) -> SelectiveReport:
    """Curve, AURC, E-AURC and the largest coverage whose accuracy reaches `target_accuracy`."""
    if not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy}")
    thresholds, coverage, accuracy = accuracy_coverage(confidences, correct)
    area = aurc(confidences, correct)
    out = SelectiveReport(
        aurc=area, e_aurc=area - optimal_aurc(correct), target_accuracy=target_accuracy,
        curve_threshold=thresholds.tolist(), curve_coverage=coverage.tolist(), curve_accuracy=accuracy.tolist(),
    )
    reached = np.flatnonzero(accuracy >= target_accuracy - 1e-12)
    if reached.size:
        i = int(reached[-1])  # coverage grows along the curve: the last point that reaches it
        n = int(round(coverage[i] * np.asarray(correct).size))
        k = int(round(accuracy[i] * n))
        lo, hi = wilson_interval(k, n)
        out = out.model_copy(update={
            "threshold_at_target": float(thresholds[i]), "coverage_at_target": float(coverage[i]),
            "answered_at_target": n, "accuracy_at_target": float(accuracy[i]),
            "accuracy_at_target_lo": lo, "accuracy_at_target_hi": hi,
        })
    return out
