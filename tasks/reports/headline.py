"""The parent run's metrics: the headline numbers of every stage, named `<stage>/<metric>`.

Named so MLflow's charts and compare view group them by stage, rounded to four significant digits (the
stage runs keep the full values), so the parent alone answers "which variant was better, and where".

    data/kept · pretrain/final_val_ppl · sft/final_val_loss · grpo/heldout_accuracy_after ·
    evaluate/grpo.answer.accuracy · evaluate/grpo.arithmetic.accuracy · pipeline/wall_minutes

Each keeps the name its stage's result and MLflow run give it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from infra.tracking.history import StageTime
from tasks.eval.differences import difference_metrics
from tasks.eval.evaluate import EvalResult

# The evaluation's numbers worth a column when comparing runs: accuracy and calibration of the answers,
# the token-level fit (comparable across tokenizers as bits per byte).
EVAL_HEADLINES = ("answer.accuracy", "answer.ece_equal_mass", "answer.aurc", "choice.accuracy", "token.ece", "bpb",
                  "val_ppl")
DATA_HEADLINES = ("collected", "kept", "sampled_rows", "contaminated", "exact_duplicates", "near_duplicates", "filtered",
                  "rejected")
# Of an eval.tasks task, besides lm-eval's own metrics and their standard errors.
TASK_HEADLINES = ("calibration.ece_equal_mass", "calibration.brier", "calibration.aurc", "clean.accuracy",
                  "contaminated.accuracy")


def significant(value: float, digits: int = 4) -> float:
    """`value` rounded to `digits` significant digits: 0.4237288135593220 → 0.4237, 1234.5678 → 1235."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))


def headline_metrics(totals: Mapping[str, int], base: Any, sft: Any, grpo: Any, evals: Mapping[str, EvalResult],
                     times: Sequence[StageTime], wall_seconds: float, all_attempts_seconds: float) -> dict[str, float]:
    """Every stage's headline numbers as `<stage>/<metric>`, rounded; None and non-finite values left out."""
    out: dict[str, float | None] = {f"data/{k}": totals.get(k) for k in DATA_HEADLINES}
    out |= {"pretrain/final_val_ppl": base.final_val_ppl, "pretrain/unigram_ppl": base.baselines.unigram_ppl if base.baselines else None,
            "sft/final_val_loss": getattr(sft, "final_val_loss", None),
            "grpo/heldout_accuracy_before": grpo.before.accuracy, "grpo/heldout_accuracy_after": grpo.after.accuracy,
            "grpo/heldout_reward_before": grpo.before.mean_reward, "grpo/heldout_reward_after": grpo.after.mean_reward,
            "grpo/flat": float(grpo.flat)}
    for name, result in evals.items():
        metrics = result.metrics()
        out |= {f"evaluate/{name}.{k}": metrics.get(k) for k in EVAL_HEADLINES}
        for task, scores in result.tasks.items():  # eval.tasks: lm-eval's metrics, their errors, the items' ECE
            out |= {f"evaluate/{name}.{task}.{k}": v for k, v in scores.flat().items()
                    if k in scores.metrics or k.endswith("_stderr") or k in TASK_HEADLINES}
    out |= {f"evaluate/{k}": v for k, v in difference_metrics(evals).items()}
    out |= {f"{t.stage}/wall_minutes": t.minutes for t in times}
    out |= {"pipeline/wall_minutes": wall_seconds / 60, "pipeline/wall_minutes_all_attempts": all_attempts_seconds / 60,
            "pipeline/stage_minutes": sum(t.minutes or 0.0 for t in times) if times else None,
            "pipeline/stages_reused": float(sum(t.reused for t in times)) if times else None}
    return {k: significant(float(v)) for k, v in out.items() if v is not None and math.isfinite(float(v))}
