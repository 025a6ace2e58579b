"""The pipeline's report card: the numbers that matter, readable in ten seconds.

Written as Markdown with the loss and reward curves, the data funnel, and the calibration
table and diagram beside it; published as a Prefect and an MLflow artifact, with the
headline metrics, and the final model registered with its lineage.
"""
from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from infra.atomic import write_text_atomic
from infra.config import config_hash
from infra.paths import Workspace
from infra.tracking import active_run, log_artifact, log_metrics, metric_history
from tasks.data.funnel import funnel_markdown, funnel_totals
from tasks.data.manifest import load_manifest
from tasks.eval.evaluate import EvalResult, comparison_table
from tasks.reports.data import publish_prefect_artifact
from tasks.reports.plots import loss_curve_png
from tasks.reports.register import lineage_tags, register_final_model

if TYPE_CHECKING:  # only for annotations: the report reads results, it never runs a training stage
    from tasks.training.grpo.stage import GrpoStageResult
    from tasks.training.sft.stage import SftResult


class PipelineReport(BaseModel):
    """The written report card, its Markdown, and the model version registered with it."""

    path: Path
    markdown: str
    model_version: str


def reward_curve(run_id: str, out: Path) -> Path | None:
    """Plot GRPO's per-step reward and accuracy from the metrics its worker logged to MLflow."""
    series, steps = {}, {}
    for key in ("reward_mean", "accuracy"):
        hist = metric_history(run_id, key)
        if hist:
            steps[key] = [step for step, _ in hist]
            series[key] = [value for _, value in hist]
    if not series:
        return None
    return loss_curve_png(steps, series, out, title="GRPO reward and accuracy on training prompts")


def _headline_rows(totals: Mapping[str, int], pretrain_ppl: tuple[float | None, float], sft: SftResult,
                   grpo: GrpoStageResult, wall_seconds: float) -> list[str]:
    val_ppl, unigram = pretrain_ppl
    b, a = grpo.before, grpo.after
    return [
        f"| pipeline wall time | {wall_seconds / 60:.1f} min |",
        f"| documents collected → kept → sampled rows | {totals.get('collected', 0)} → {totals.get('kept', 0)} → {totals.get('sampled_rows', 0)} |",
        f"| near duplicates / exact duplicates / filtered / rejected | {totals.get('near_duplicates', 0)} / {totals.get('exact_duplicates', 0)} / {totals.get('filtered', 0)} / {totals.get('rejected', 0)} |",
        f"| base model validation perplexity (unigram baseline) | {val_ppl:.1f} ({unigram:.1f}) |" if val_ppl else f"| unigram baseline perplexity | {unigram:.1f} |",
        f"| SFT validation loss | {sft.val_loss:.3f} |" if sft.val_loss is not None else "| SFT validation loss | - |",
        f"| held-out arithmetic accuracy SFT → GRPO | {b.n_correct}/{b.n} ({b.accuracy:.1%}) → {a.n_correct}/{a.n} ({a.accuracy:.1%}) |",
        f"| held-out mean reward SFT → GRPO | {b.mean_reward:.3f} → {a.mean_reward:.3f} |",
    ]


def write_final_report(
    manifest: Path,
    pretrain_ppl: tuple[float | None, float],
    sft: SftResult,
    grpo: GrpoStageResult,
    evals: Mapping[str, EvalResult],
    images: Mapping[str, Path | None],
    wall_seconds: float,
    out: Path,
) -> Path:
    """Write the report card and return its path."""
    m = load_manifest(manifest)
    lines = ["# llmforge report card", "", "| headline | value |", "|---|---|"]
    lines += _headline_rows(funnel_totals(m.funnel), pretrain_ppl, sft, grpo, wall_seconds)
    for name, r in evals.items():
        answer_ece = f"{r.answer_calibration.ece:.3f}" if r.answer_calibration else "-"
        lines.append(f"| {name}: perplexity / token ECE / answer ECE | {r.perplexity:.1f} / {r.token_calibration.ece:.3f} / {answer_ece} |")
    lines += ["", "## Calibration", "", comparison_table(evals), ""]
    for label, img in images.items():
        if img is not None:
            lines.append(f"![{label}]({img.name})")
    lines += ["", "## Data funnel", "", funnel_markdown(m.funnel), ""]
    return write_text_atomic(out, "\n".join(lines) + "\n")


def _copy(src: Path | None, dst: Path) -> Path | None:
    """Put a figure beside the report so its relative links resolve."""
    if src is None or not Path(src).is_file():
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _report_images(ws: Workspace, base, sft: SftResult, grpo: GrpoStageResult) -> dict[str, Path | None]:
    out = ws.reports
    return {
        "pretraining loss": _copy(base.loss_curve, out / "pretrain_loss.png"),
        "SFT loss": _copy(sft.loss_curve, out / "sft_loss.png"),
        "GRPO reward": reward_curve(grpo.mlflow_run_id, out / "grpo_reward.png") if grpo.mlflow_run_id else None,
        "calibration": _copy(ws.eval_dir / "calibration_comparison.png", out / "calibration_comparison.png"),
    }


def _headline_metrics(base, grpo: GrpoStageResult, wall_seconds: float) -> dict[str, float | None]:
    return {
        "wall_minutes": wall_seconds / 60,
        "base.val_ppl": base.val_ppl,
        "base.unigram_ppl": base.unigram_ppl,
        "sft.heldout_accuracy": grpo.before.accuracy,
        "grpo.heldout_accuracy": grpo.after.accuracy,
        "sft.heldout_reward": grpo.before.mean_reward,
        "grpo.heldout_reward": grpo.after.mean_reward,
    }


def publish_pipeline_report(ws: Workspace, config, data, base, sft, grpo, evals, wall_seconds: float) -> PipelineReport:
    """Write the report card, publish it (Prefect + the active MLflow run) and register the final model."""
    active_run()
    images = _report_images(ws, base, sft, grpo)
    path = write_final_report(
        Path(data.manifest), (base.val_ppl, base.unigram_ppl), sft, grpo, evals, images, wall_seconds, ws.reports / "report.md"
    )
    markdown = path.read_text()
    publish_prefect_artifact(markdown, key="pipeline-report")
    log_artifact(path, artifact_path="report")
    for img in images.values():
        if img is not None:
            log_artifact(img, artifact_path="report")
    log_metrics(_headline_metrics(base, grpo, wall_seconds))
    stage_runs = {"data": data.mlflow_run_id, "pretrain": base.mlflow_run_id, "sft": sft.mlflow_run_id, "grpo": grpo.mlflow_run_id}
    lineage = lineage_tags(Path(data.manifest), Path(base.tokenizer), config_hash(config), stage_runs)
    version = register_final_model(grpo.hf_dir, config.registered_model, lineage)
    return PipelineReport(path=path, markdown=markdown, model_version=version)
