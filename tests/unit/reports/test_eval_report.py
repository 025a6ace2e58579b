"""The report card and the eval run show intervals, significance, n/a and selective prediction, and log them."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest

from infra.tracking.runs import stage_run
from infra.workspace.paths import Workspace
from tasks.data.manifest import Manifest, write_manifest
from tasks.eval.differences import stage_differences
from tasks.eval.evaluate import EVAL_FILE
from tasks.reports.card import write_final_report
from tasks.reports.eval import log_comparison
from tests.conftest import eval_result_with_answers


def _evals() -> dict:
    rng = np.random.default_rng(2)
    questions = [f"What is {i} + 2?" for i in range(520)]
    skill = rng.uniform(size=520)
    sft = rng.uniform(size=520) < skill * 0.6
    grpo = sft.copy()
    grpo[rng.choice(520, 12, replace=False)] = True  # a few more right: too few to tell from noise?
    conf = np.clip(skill + rng.normal(0, 0.05, 520), 0.01, 0.99)
    base = eval_result_with_answers(questions, np.zeros(520, bool), np.full(520, 0.1), "few_shot")
    # The base model stated no parseable answer: n/a, never a perfect-looking 0.000.
    base = base.model_copy(update={
        "answers": [a.model_copy(update={"parsed": None}) for a in base.answers],
        "answer_calibration": None, "answer_bins": None, "answer_selective": None, "answer_abstention": None,
    })
    in_range = np.arange(520) < 60
    evals = {"base": base, "sft": eval_result_with_answers(questions, sft, conf, in_range=in_range),
             "grpo": eval_result_with_answers(questions, grpo, conf, in_range=in_range)}
    losses = {"perplexity_lo": 2.5, "perplexity_hi": 2.9, "n_bytes": 31}
    return {name: r.model_copy(update={**losses, "bpb": bpb, "bpb_lo": bpb - 0.1, "bpb_hi": bpb + 0.1})
            for (name, r), bpb in zip(evals.items(), (1.25, 1.5, 1.75))}


def test_report_card_shows_intervals_significance_and_selective_prediction(tmp_path: Path) -> None:
    evals = _evals()
    manifest = write_manifest(Manifest(funnel={"web": {"collected": 10, "kept": 8, "filtered": 2}}),
                              tmp_path / "manifest.json")
    stage_score = SimpleNamespace(n_correct=36, n=59, accuracy=36 / 59, mean_reward=0.7)
    grpo = SimpleNamespace(before=stage_score, after=stage_score, flat=True, steps=40)
    path = write_final_report(manifest, (None, 100.0), SimpleNamespace(final_val_loss=0.25, examples_val=59), grpo, evals, {},
                              60.0, tmp_path / "report.md", rewards={"arithmetic_exact": 1.0, "abstain": 0.6})
    text = path.read_text()
    assert "| GRPO's rewards, as it trained with them | arithmetic_exact 1, abstain 0.6 |" in text
    assert "| SFT loss on its 59 held-out examples (assistant tokens, nats per token) | 0.250 |" in text
    assert "| **GRPO was flat** | its rollouts' reward and KL did not move beyond noise over 40 steps" in text
    wrong = 520 - sum(a.correct for a in evals["sft"].answers)
    assert f"| hallucination rate SFT → GRPO: wrong and not abstained, of all 520 questions (95% CI) | {wrong}/520 (" in text
    assert "| hallucination rate (wrong and not abstained, of all questions) |" in text
    g = evals["grpo"].answer_abstention  # issue 51: where GRPO's abstentions land, and its selective accuracy
    assert f"| where GRPO's {g.abstention.correct} abstentions land: on questions SFT got right / got wrong / " in text
    assert "| GRPO's selective accuracy: right among the questions it answers (95% CI) | " in text
    sft_k, grpo_k = sum(a.correct for a in evals["sft"].answers), sum(a.correct for a in evals["grpo"].answers)
    assert f"| held-out arithmetic accuracy SFT → GRPO, evaluation (520 questions, 95% CI) | {sft_k}/520 (" in text
    assert f"→ {grpo_k}/520 (" in text
    assert "| GRPO − SFT accuracy (paired, 95% CI) | +" in text
    assert "| held-out arithmetic accuracy SFT → GRPO, the GRPO stage's own check (95% CI) | 36/59 (61.0% [48.3%, 72.4%]) →" in text
    # Perplexity and bits per byte for every model, each naming the tokens it is on; the table beside them.
    for name, bpb in (("base", "1.250 [1.150, 1.350]"), ("sft", "1.500 [1.400, 1.600]"), ("grpo", "1.750 [1.650, 1.850]")):
        assert (f"| {name}, evaluation on the first 10 tokens of the val split: perplexity / bits per byte / token ECE / "
                f"answer ECE (equal mass); 95% CI | 2.7 [2.5, 2.9] / {bpb} / ") in text
    assert "| bits per byte (comparable across tokenizers) | 1.2500 [1.1500, 1.3500] | 1.5000 [1.4000, 1.6000] |" in text
    assert "| perplexity | 2.72 [2.50, 2.90] |" in text
    assert "n/a (no answer) |" in text
    assert "| answer accuracy [95% CI] | n/a (no answer) |" in text
    assert "| sft − base | n/a |" in text  # no paired difference against a model with no answers
    assert "## Selective prediction" in text and "| grpo, answers |" in text and "threshold for accuracy ≥ 0.80" in text
    diffs = stage_differences(evals)
    assert f"| GRPO − SFT accuracy (paired, 95% CI) | {diffs['grpo_vs_sft.answer'].describe('SFT', 'GRPO')} |" in text
    inside = diffs["grpo_vs_sft.answer_in_range"]
    assert inside.n == 60 and f"| GRPO − SFT within the training range (paired, 95% CI) | {inside.describe('SFT', 'GRPO')} |" in text
    assert f"| of those, operands within the training range | {evals['sft'].answer_in_range.describe()} → " in text


def test_parent_run_metrics_are_every_stages_headline_grouped_by_stage_and_rounded() -> None:
    from infra.tracking.history import StageTime
    from tasks.reports.headline import headline_metrics, significant

    score = SimpleNamespace(accuracy=36 / 59, mean_reward=0.5)
    evals = _evals()
    times = [StageTime(stage="pretrain", run_id="r1", minutes=6.123456, reused=True),
             StageTime(stage="sft", run_id="r2", minutes=4.9, reused=False)]
    metrics = headline_metrics({"collected": 10, "kept": 8}, SimpleNamespace(final_val_ppl=9.0, baselines=SimpleNamespace(unigram_ppl=20.0)),
                               SimpleNamespace(final_val_loss=None), SimpleNamespace(before=score, after=score, flat=False), evals,
                               times, 60.0, 90.0)
    assert (metrics["evaluate/base.bpb"], metrics["evaluate/sft.bpb"], metrics["evaluate/grpo.bpb"]) == (1.25, 1.5, 1.75)
    assert metrics["grpo/heldout_accuracy_after"] == 0.6102 and metrics["data/kept"] == 8
    assert "sft/final_val_loss" not in metrics
    assert metrics["pretrain/wall_minutes"] == 6.123 and metrics["pipeline/stage_minutes"] == 11.02
    assert metrics["pipeline/stages_reused"] == 1 and metrics["pipeline/wall_minutes_all_attempts"] == 1.5
    assert metrics["evaluate/grpo.answer.accuracy"] == significant(evals["grpo"].metrics()["answer.accuracy"])
    assert "evaluate/grpo_vs_sft.answer.accuracy_diff" in metrics
    assert metrics["grpo/flat"] == 0.0  # the pipeline run says whether GRPO moved, beside the GRPO run's tag
    assert all("/" in k and k.split("/")[0] in {"data", "pretrain", "sft", "grpo", "evaluate", "pipeline"} for k in metrics)
    assert all(v == significant(v) for v in metrics.values())  # no 16-digit floats
    assert [significant(v) for v in (0.4237288135593220, 1234.5678, -0.00123456, 0.0)] == [0.4237, 1235.0, -0.001235, 0.0]


def test_eval_run_logs_intervals_differences_and_figures(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    ws = Workspace(tmp_path / "work")
    evals = _evals()
    dirs = {}
    for name, r in evals.items():
        dirs[name] = tmp_path / "eval" / name
        dirs[name].mkdir(parents=True)
        (dirs[name] / EVAL_FILE).write_text(r.model_dump_json())
    with stage_run(ws, "evaluate") as run:
        markdown = log_comparison(evals, dirs, tmp_path / "out")
    logged = mlflow.get_run(run.info.run_id).data.metrics
    assert logged["sft.answer.accuracy_lo"] < logged["sft.answer.accuracy"] < logged["sft.answer.accuracy_hi"]
    assert {"grpo.answer.ece_lo", "grpo.answer.ece_hi", "grpo.answer.aurc", "grpo_vs_sft.answer.accuracy_diff",
            "grpo_vs_sft.answer.accuracy_diff_lo", "grpo_vs_sft.answer.accuracy_diff_hi"} <= set(logged)
    assert logged["base.answer.n_stated"] == 0 and "base.answer.accuracy" not in logged
    assert logged["grpo.bpb_lo"] < logged["grpo.bpb"] == 1.75 < logged["grpo.bpb_hi"] and logged["sft.val_ppl_hi"] == 2.9
    assert "| accuracy difference (paired, 95% CI) |" in markdown
    assert (tmp_path / "out" / "accuracy_coverage.png").stat().st_size > 5_000
    assert markdown in (tmp_path / "out" / "comparison.md").read_text()
    artifacts = {f.path for f in mlflow.MlflowClient().list_artifacts(run.info.run_id, "eval")}
    assert {"eval/comparison.md", "eval/calibration_comparison.png", "eval/accuracy_coverage.png"} <= artifacts
    per_model = {f.path for f in mlflow.MlflowClient().list_artifacts(run.info.run_id, "eval/sft")}
    assert per_model == {"eval/sft/eval.json", "eval/sft/reliability_tokens.png", "eval/sft/reliability_answers.png"}


def test_paired_difference_is_by_question() -> None:
    evals = _evals()
    d = stage_differences(evals)["grpo_vs_sft.answer"]
    assert d.n == 520 and d.only_a == 0 and 0 < d.only_b <= 12 and d.difference == pytest.approx(d.only_b / 520)
