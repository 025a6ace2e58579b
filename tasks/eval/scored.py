"""Answers scored by their confidence: accuracy, ECE and Brier with intervals, reliability bins and the selective
report (AURC with its interval): what the pipeline's answers and every lm-eval task's items get alike."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models.calibration import CalibrationReport, ReliabilityBins, calibration_report, reliability_bins
from tasks.eval.config import EvalConfig
from tasks.eval.intervals import bootstrap_ece_interval, bootstrap_interval, bootstrap_ratio_interval, proportion
from tasks.eval.selective import SelectiveReport, aurc, selective_report


def scored_answers(confidences: Sequence[float], correct: Sequence[bool],
                   cfg: EvalConfig) -> tuple[CalibrationReport, ReliabilityBins, SelectiveReport]:
    """Calibration with its intervals (accuracy, ECEs, Brier), reliability bins and the selective-prediction report
    (AURC with its interval) of one set of answers."""
    report = calibration_report(confidences, correct, cfg.n_bins)
    acc = proportion(correct)
    ece_lo, ece_hi = bootstrap_ece_interval(confidences, correct, cfg.n_bins, "uniform", cfg.bootstrap_resamples, cfg.seed)
    em_lo, em_hi = bootstrap_ece_interval(confidences, correct, cfg.n_bins, "quantile", cfg.bootstrap_resamples, cfg.seed)
    report = report.model_copy(update={
        "accuracy_lo": acc.accuracy_lo, "accuracy_hi": acc.accuracy_hi,
        "ece_lo": ece_lo, "ece_hi": ece_hi, "ece_equal_mass_lo": em_lo, "ece_equal_mass_hi": em_hi,
    })
    bins = reliability_bins(confidences, correct, cfg.n_bins, cfg.answer_bin_strategy)
    selective = selective_report(confidences, correct, cfg.target_accuracy)
    conf, right = np.asarray(confidences, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    if conf.size >= 2:  # one answer resamples to itself: no interval
        lo, hi = bootstrap_ratio_interval((conf - right) ** 2, np.ones_like(conf), cfg.bootstrap_resamples, cfg.seed)
        report = report.model_copy(update={"brier_lo": lo, "brier_hi": hi})
        lo, hi = bootstrap_interval(conf.size, lambda idx: aurc(conf[idx], right[idx]), cfg.bootstrap_resamples, cfg.seed)
        selective = selective.model_copy(update={"aurc_lo": lo, "aurc_hi": hi})
    return report, bins, selective
