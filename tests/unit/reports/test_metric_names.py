"""One name per metric: the evaluation run and the GRPO run use the names the training runs
and the report card use, and no two names of one run differ only in `.` versus `_`."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np

from models.calibration import calibration_report, reliability_bins
from tasks.eval.answers import AnswerScore
from tasks.eval.evaluate import EvalResult
from tasks.reports.eval import comparison_table
from tasks.training.grpo.stage import heldout_metrics
from tasks.training.grpo.steps import eval_metrics


def _normalized(name: str) -> str:
    return re.sub(r"[._]", "", name)


def _eval_result() -> EvalResult:
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.2, 1.0, 400)
    correct = rng.uniform(size=400) < conf
    return EvalResult(
        n_tokens=400, seq_len=32, val_loss=2.0, perplexity=float(np.exp(2.0)), token_accuracy=float(correct.mean()),
        perplexity_lo=7.0, perplexity_hi=7.8, bpb=1.2, bpb_lo=1.1, bpb_hi=1.3, n_bytes=1500,
        token_calibration=calibration_report(conf, correct), token_bins=reliability_bins(conf, correct),
    )


def _with_answers(result: EvalResult) -> EvalResult:
    from tasks.eval.config import EvalConfig
    from tasks.eval.scored import scored_answers

    rng = np.random.default_rng(1)
    conf = rng.uniform(0.2, 1.0, 300)
    correct = rng.uniform(size=300) < conf
    cfg = EvalConfig(bootstrap_resamples=50, target_accuracy=0.7)
    answer = scored_answers(conf, correct, cfg)
    choice = scored_answers(conf[::-1], correct, cfg)
    from tasks.eval.intervals import proportion

    return result.model_copy(update={
        "answer_calibration": answer[0], "answer_bins": answer[1], "answer_selective": answer[2],
        "answer_in_range": proportion(correct[:50]),
        "choice_calibration": choice[0], "choice_bins": choice[1], "choice_selective": choice[2],
    })


def test_eval_metrics_have_one_name_each_and_the_training_names() -> None:
    result = _with_answers(_eval_result())
    metrics = result.metrics()
    # The intervals and selective-prediction numbers the issue asks for, under their MLflow names.
    assert {"answer.accuracy_lo", "answer.accuracy_hi", "answer.ece_lo", "answer.ece_hi", "answer.aurc",
            "answer.threshold_at_target", "answer_in_range.accuracy", "choice.accuracy_lo", "choice.aurc"} <= set(metrics)
    assert not any(k.startswith("answer.curve_") for k in metrics)  # the curve is in eval.json and the figure
    assert len({_normalized(k) for k in metrics}) == len(metrics), sorted(metrics)
    assert "token_accuracy" not in metrics and metrics["token.accuracy"] == result.token_accuracy
    assert "perplexity" not in metrics and metrics["val_ppl"] == result.perplexity  # as pretrain/SFT log it
    # Bits per byte as `bpb` (training validation: `val_bpb`), its interval as every interval is named.
    assert (metrics["bpb"], metrics["bpb_lo"], metrics["bpb_hi"]) == (1.2, 1.1, 1.3)
    assert (metrics["val_ppl_lo"], metrics["val_ppl_hi"]) == (7.0, 7.8) and not any("bits" in k for k in metrics)
    table = comparison_table({"base": result})
    assert f"| perplexity | {result.perplexity:.2f} [7.00, 7.80] |" in table
    assert "| bits per byte (comparable across tokenizers) | 1.2000 [1.1000, 1.3000] |" in table
    assert f"| next-token accuracy | {result.token_accuracy:.4f} |" in table


def test_grpo_logs_its_held_out_score_under_the_heldout_names() -> None:
    score = AnswerScore(accuracy=0.5, mean_reward=0.6, n_correct=5, n=10, distinct_answers=7)
    curve = eval_metrics(score)
    assert set(curve) == {"heldout_accuracy", "heldout_reward", "heldout_problems"}
    before = SimpleNamespace(accuracy=0.4, mean_reward=0.5, n_correct=4, n=10, distinct_answers=6)
    after = SimpleNamespace(accuracy=0.5, mean_reward=0.6, n_correct=5, n=10, distinct_answers=7)
    final = heldout_metrics(SimpleNamespace(before=before, after=after, flat=False))
    # The curve's names are the stems of the before/after summary, not a second vocabulary.
    assert {"heldout_accuracy_before", "heldout_accuracy_after", "heldout_reward_before", "heldout_problems"} <= set(final)
    names = [*curve, *final]
    assert len({_normalized(k) for k in names}) == len(set(names))
