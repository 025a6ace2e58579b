"""The pipeline's report card: the numbers that matter, readable in ten seconds.

Written as Markdown (a Prefect artifact and an MLflow artifact) with the loss and reward
curves, the data funnel, and the calibration table and diagram beside it.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tasks.eval.evaluate import EvalResult, comparison_table
from tasks.data.funnel import funnel_markdown, funnel_totals
from tasks.training.grpo.stage import GrpoStageResult
from tasks.data.manifest import load_manifest
from tasks.training.sft.stage import SftResult


def reward_curve(run_id: str, out: Path) -> Path | None:
    """Plot GRPO's per-step reward and accuracy from the metrics its worker logged to MLflow."""
    from mlflow.tracking import MlflowClient

    from tasks.reports.plots import loss_curve_png

    client = MlflowClient()
    series = {}
    steps = {}
    for key in ("reward_mean", "accuracy"):
        hist = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        if hist:
            series[key] = [m.value for m in hist]
            steps[key] = [m.step for m in hist]
    if not series:
        return None
    return loss_curve_png(steps, series, out, title="GRPO reward and accuracy on training prompts")


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
    val_ppl, unigram = pretrain_ppl
    m = load_manifest(manifest)
    totals = funnel_totals(m.funnel)
    b, a = grpo.before, grpo.after
    lines = [
        "# llmforge report card",
        "",
        "| headline | value |",
        "|---|---|",
        f"| pipeline wall time | {wall_seconds / 60:.1f} min |",
        f"| documents collected → kept → sampled rows | {totals.get('collected', 0)} → {totals.get('kept', 0)} → {totals.get('sampled_rows', 0)} |",
        f"| near duplicates / exact duplicates / filtered / rejected | {totals.get('near_duplicates', 0)} / {totals.get('exact_duplicates', 0)} / {totals.get('filtered', 0)} / {totals.get('rejected', 0)} |",
        f"| base model validation perplexity (unigram baseline) | {val_ppl:.1f} ({unigram:.1f}) |" if val_ppl else f"| unigram baseline perplexity | {unigram:.1f} |",
        f"| SFT validation loss | {sft.val_loss:.3f} |" if sft.val_loss is not None else "| SFT validation loss | - |",
        f"| held-out arithmetic accuracy SFT → GRPO | {b.n_correct}/{b.n} ({b.accuracy:.1%}) → {a.n_correct}/{a.n} ({a.accuracy:.1%}) |",
        f"| held-out mean reward SFT → GRPO | {b.mean_reward:.3f} → {a.mean_reward:.3f} |",
    ]
    for name, r in evals.items():
        answer_ece = f"{r.answer_calibration.ece:.3f}" if r.answer_calibration else "-"
        lines.append(f"| {name}: perplexity / token ECE / answer ECE | {r.perplexity:.1f} / {r.token_calibration.ece:.3f} / {answer_ece} |")
    lines += ["", "## Calibration", "", comparison_table(evals), ""]
    for label, img in images.items():
        if img is not None:
            lines.append(f"![{label}]({img.name})")
    lines += ["", "## Data funnel", "", funnel_markdown(m.funnel), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out
