"""Consecutive models (base -> SFT -> GRPO) compared: the paired accuracy difference on the questions both were asked.

With its 95% interval, on all answers, on the answers within the training range, and on multiple choice
(the interval itself: tasks/eval/intervals.paired_difference).
"""
from __future__ import annotations

from collections.abc import Mapping

from tasks.eval.evaluate import EvalResult
from tasks.eval.intervals import PairedDifference, paired_difference

# What a difference is taken on: every answer, the answers within the training range, multiple choice.
PAIRED_LEVELS = ("answer", "answer_in_range", "choice")


def _correct_by_question(result: EvalResult, level: str) -> dict[str, bool]:
    if level == "choice":
        return {c.question: c.correct for c in result.choices}
    if result.answer_calibration is None:
        return {}  # n/a: no answers to compare
    return {a.question: a.correct for a in result.answers if level == "answer" or a.in_train_range}


def stage_differences(results: Mapping[str, EvalResult]) -> dict[str, PairedDifference]:
    """Each model against the one before it (base -> sft -> grpo), paired on the questions both were asked:
    keys `<b>_vs_<a>.answer`, `.answer_in_range` and `.choice`; none where a side has n/a."""
    names = list(results)
    out: dict[str, PairedDifference] = {}
    for a, b in zip(names, names[1:]):
        for level in PAIRED_LEVELS:
            ca, cb = _correct_by_question(results[a], level), _correct_by_question(results[b], level)
            common = [q for q in cb if q in ca]
            if common:
                out[f"{b}_vs_{a}.{level}"] = paired_difference([ca[q] for q in common], [cb[q] for q in common])
    return out


def difference_metrics(results: Mapping[str, EvalResult]) -> dict[str, float]:
    """The paired differences as MLflow metrics: `grpo_vs_sft.answer.accuracy_diff` and its `_lo`, `_hi`."""
    out: dict[str, float] = {}
    for key, d in stage_differences(results).items():
        out[f"{key}.accuracy_diff"] = d.difference
        out[f"{key}.accuracy_diff_lo"] = d.lo
        out[f"{key}.accuracy_diff_hi"] = d.hi
    return out
