"""The scaling sweep's report: its points, the fitted laws, the prediction against the trained run.

The fitted laws with intervals, as Markdown with figures in the sweep's folder, an MLflow artifact and a
Prefect artifact.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from infra.tracking.runs import log_metrics
from models.scaling_bootstrap import ScalingBootstrap, ScalingIntervals
from tasks.reports.data import PublishedReport, publish_report
from tasks.reports.scaling_plots import contours_png, frontier_png, isoflop_png
from tasks.training.scaling.prediction import Prediction
from tasks.training.scaling.sweep import MeasuredPoint


def _interval_row(name: str, iv, fmt: str = ".3f") -> str:
    return f"| {name} | {iv.estimate:{fmt}} | [{iv.low:{fmt}}, {iv.high:{fmt}}] |"


def scale_report_markdown(points: Sequence[MeasuredPoint], train_tokens: int, sb: ScalingBootstrap | None,
                          intervals: ScalingIntervals | None, prediction: Prediction | None,
                          warnings: Sequence[str], note: str | None) -> str:
    """The report's Markdown; `note` says why nothing was fitted, when nothing was."""
    lines = ["# Scaling sweep", "",
             f"{len(points)} runs of one model family (models/family.py) on the same token shards "
             f"({train_tokens:,} unique training tokens), tokenizer and validation windows; each trained for "
             "D = C / (its FLOPs per token) tokens, its cosine schedule ending at D.", "",
             "| budget C (FLOPs) | depth | N | D | tokens/param | steps | epochs | val bits/byte | val loss (nats/token) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in sorted(points, key=lambda p: (p.budget, p.n_params)):
        # A point on its own, smaller micro-batch (scale.min_steps) says so beside its steps.
        steps = f"{p.steps:,}" + (f" ({p.micro_batch_size}/micro-batch)" if p.micro_batch_size else "")
        lines.append(f"| {p.budget:.3g} | {p.depth} | {p.n_params:,} | {p.tokens:,} | {p.tokens_per_param:.1f} | "
                     f"{steps} | {p.epochs:.2f} | {p.final_val_bpb:.4f} | {p.final_val_loss:.4f} |")
    lines += [""] + [f"WARNING: {w}" for w in warnings] + ([""] if warnings else [])
    if sb is None or intervals is None:
        return "\n".join(lines + [f"Not fitted: {note}", ""])
    law = sb.law
    lines += [
        "## Fits", "",
        "![IsoFLOP curves](isoflop.png)", "", "![frontier](frontier.png)", "", "![L(N, D)](contours.png)", "",
        f"Approach 3 (Huber on log residuals, L-BFGS): L(N, D) = {law.E:.4f} + {law.A:.4g} / N^{law.alpha:.4f} + "
        f"{law.B:.4g} / D^{law.beta:.4f} bits per byte. Approach 2: N_opt = {_exp(sb.isoflop.log_k_n)} C^{sb.isoflop.a:.3f}, "
        f"D_opt = {_exp(sb.isoflop.log_k_d)} C^{sb.isoflop.b:.3f}. Intervals: {sb.resamples} bootstrap resamples, "
        f"{intervals.level:.0%}.", "",
        "| quantity | estimate | 95% interval |", "|---|---:|---|",
        _interval_row("a (N_opt ~ C^a)", intervals.a), _interval_row("b (D_opt ~ C^b)", intervals.b),
        _interval_row("alpha", intervals.alpha), _interval_row("beta", intervals.beta), _interval_row("E", intervals.E),
        _interval_row(f"optimal tokens per parameter at C = {intervals.compute:.3g} (C = 6 N D)",
                      intervals.tokens_per_param, ".1f"),
        "", "Chinchilla's 20 tokens per parameter is drawn for reference in the frontier and contour figures.", "",
    ]
    if prediction is not None:
        lines += prediction_lines(prediction)
    return "\n".join(lines)


def _exp(log_k: float) -> str:
    return f"{math.exp(log_k):.3g}"


def prediction_lines(pred: Prediction) -> list[str]:
    """The predicted-versus-measured table of the run at predict_factor x the largest budget."""
    low, high = pred.interval
    measured = "not trained yet" if pred.measured_bpb is None else f"{pred.measured_bpb:.4f}"
    error = "" if pred.error is None else f"{pred.error:+.2%}"
    inside = "" if pred.inside is None else ("yes" if pred.inside else "NO")
    half = (high - low) / 2 / pred.predicted_bpb
    return [
        "## Predicted, then trained", "",
        f"Before training it, the fit chose depth {pred.depth} (N = {pred.n_params:,}) on D = {pred.tokens:,} tokens "
        f"({pred.tokens_per_param:.1f} per parameter, {pred.flops:.3g} FLOPs) at C = {pred.budget:.3g}; the law's optimum "
        f"between family members is N = {pred.law_n_params:,.0f} on D = {pred.law_tokens:,.0f}, approach 2's "
        f"N_opt(C) = {pred.isoflop_n_params:,.0f}.", "",
        "| run | predicted bits/byte | 95% interval | half-width | measured | measured / predicted - 1 | inside |",
        "|---|---:|---|---:|---:|---:|---|",
        f"| depth {pred.depth}, C = {pred.budget:.3g} | {pred.predicted_bpb:.4f} | [{low:.4f}, {high:.4f}] | "
        f"{half:.2%} | {measured} | {error} | {inside} |", "",
    ]


def publish_scale_report(folder: Path, points: Sequence[MeasuredPoint], train_tokens: int,
                         sb: ScalingBootstrap | None, intervals: ScalingIntervals | None,
                         prediction: Prediction | None, warnings: Sequence[str], note: str | None) -> PublishedReport:
    """Write report.md and its figures into the sweep's folder; log them and the fitted numbers to the active run."""
    folder = Path(folder)
    isoflop_png(points, sb, folder / "isoflop.png")
    frontier_png(points, sb, prediction, folder / "frontier.png")
    if sb is not None:
        contours_png(points, sb, prediction, folder / "contours.png")
    if intervals is not None:
        log_metrics({f"fit_{k}": getattr(intervals, k).estimate for k in ("a", "b", "alpha", "beta", "E")}
                    | {"fit_tokens_per_param": intervals.tokens_per_param.estimate,
                       "fit_tokens_per_param_low": intervals.tokens_per_param.low,
                       "fit_tokens_per_param_high": intervals.tokens_per_param.high})
    markdown = scale_report_markdown(points, train_tokens, sb, intervals, prediction, warnings, note)
    return publish_report(folder, markdown, {}, "scale", "scale-report")  # the figures are written above
