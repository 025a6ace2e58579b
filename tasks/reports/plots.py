"""The reports' figures: reliability diagrams, model comparison, accuracy-coverage, data funnel.

Figures are built on matplotlib's object API with the Agg canvas (no pyplot state, no
display needed) and written atomically, so a reader never sees half a PNG.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from infra.workspace.atomic import write_figure_atomic

if TYPE_CHECKING:  # annotations only: the data flow draws its funnel without importing torch
    from models.calibration import CalibrationReport, ReliabilityBins
    from tasks.eval.selective import SelectiveReport

# Where collected documents ended, in the stacking order of the funnel chart.
_FUNNEL_FATES = ("kept", "filtered", "near_duplicates", "exact_duplicates", "rejected")


def _bin_arrays(bins: ReliabilityBins) -> tuple[np.ndarray, ...]:
    edges = np.asarray(bins.edges, dtype=float)
    return (
        edges,
        np.asarray(bins.mean_confidence, dtype=float),
        np.asarray(bins.accuracy, dtype=float),
        np.asarray(bins.counts, dtype=float),
    )


def _bin_wilson(acc: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distances from each non-empty bin's accuracy down and up to its Wilson 95% bounds (error bars)."""
    # Imported here: tasks/eval/intervals.py imports torch (models/calibration.py), and the data flow's process draws
    # its funnel with this module without loading torch.
    from tasks.eval.intervals import wilson_interval

    bounds = np.array([wilson_interval(int(round(a * c)), int(c)) for a, c in zip(acc, counts)]).reshape(-1, 2)
    return np.maximum(acc - bounds[:, 0], 0.0), np.maximum(bounds[:, 1] - acc, 0.0)


def _draw_reliability(ax, bins: ReliabilityBins) -> None:
    """Equal-width bins as bars; equal-mass bins, whose spans differ widely, as points at their mean
    confidence. Either way each bin's accuracy carries its Wilson 95% interval."""
    edges, conf, acc, counts = _bin_arrays(bins)
    nonempty = counts > 0
    left, width = edges[:-1][nonempty], np.diff(edges)[nonempty]
    conf, acc, counts = conf[nonempty], acc[nonempty], counts[nonempty]
    if bins.strategy == "uniform":
        x = left + width / 2
        ax.bar(left, acc, width=width, align="edge", color="#4C72B0", edgecolor="white", label="accuracy")
        # The gap bar runs from accuracy to mean confidence: above the blue bar means overconfident,
        # inside it underconfident; the tick marks where the confidence itself sits.
        ax.bar(left, conf - acc, bottom=acc, width=width, align="edge", color="none", edgecolor="#C44E52",
               hatch="//", label="gap to confidence")
        ax.scatter(x, conf, marker="_", s=120, color="black", zorder=3, label="mean confidence")
    else:
        x = conf  # on the diagonal's x: the gap to perfect calibration is the vertical distance
        ax.vlines(x, acc, conf, color="#C44E52", lw=2, label="gap to confidence")
        ax.scatter(x, acc, color="#4C72B0", zorder=3, s=18, label="accuracy at mean confidence")
    # A bin of 3 answers says little: its interval is drawn with it.
    ax.errorbar(x, acc, yerr=_bin_wilson(acc, counts), fmt="none", ecolor="#333333", elinewidth=0.8, capsize=2,
                zorder=4, label="accuracy, 95% CI")
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")


def _bins_note(bins: ReliabilityBins) -> str:
    counts = [c for c in bins.counts if c > 0]
    if bins.strategy == "quantile" and counts:
        each = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        return f"{len(counts)} equal-mass bins of {each}"
    return f"{len(bins.counts)} equal-width bins"


def reliability_diagram_png(
    bins: ReliabilityBins, path: Path, title: str = "Reliability diagram", ece: float | None = None,
    ece_interval: tuple[float | None, float | None] | None = None,
) -> Path:
    """Accuracy per confidence bin (with its count and Wilson interval) against the diagonal, the histogram beneath."""
    fig = Figure(figsize=(5.5, 6.5))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    _draw_reliability(top, bins)
    if ece is not None:
        lo, hi = ece_interval or (None, None)
        band = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
        title = f"{title}\nECE {ece:.3f}{band}, {_bins_note(bins)}"
    top.set_title(title, fontsize=10)
    top.legend(loc="upper left", fontsize=7, framealpha=0.9)
    edges, _, _, counts = _bin_arrays(bins)
    widths = np.diff(edges)
    if bins.strategy == "quantile":
        # Equal counts over unequal spans: the height that shows where the confidences lie is count / span.
        heights = np.divide(counts, widths, out=np.zeros_like(counts), where=widths > 0)
        bottom.set_ylabel("predictions\nper unit conf.")
    else:
        heights = counts
        bottom.set_ylabel("predictions")
    bars = bottom.bar(edges[:-1], heights, width=widths, align="edge", color="#8C8C8C", edgecolor="white")
    if bins.strategy == "uniform":  # each bin's count over its bar (equal-mass bins: in the title)
        bottom.bar_label(bars, labels=[str(c) if c else "" for c in bins.counts], fontsize=6, padding=1,
                         rotation=90 if len(bins.counts) > 10 else 0)
        bottom.margins(y=0.35)
    bottom.set_xlabel(f"confidence ({_bins_note(bins)}, n={bins.n})")
    top.set_xlabel("")
    return write_figure_atomic(fig, path)


def compare_models_png(
    reports: Mapping[str, tuple[CalibrationReport, ReliabilityBins]],
    path: Path,
    title: str = "Calibration by training stage",
) -> Path:
    """Reliability curves of several models on one axis and a bar chart of their ECE, Brier and NLL."""
    if not reports:
        raise ValueError("compare_models_png needs at least one (report, bins) entry; got none")
    fig = Figure(figsize=(12, 5), layout="constrained")
    curves, scores = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    curves.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect")
    for name, (report, bins) in reports.items():
        _, conf, acc, counts = _bin_arrays(bins)
        nonempty = counts > 0
        value = report.ece_equal_mass if bins.strategy == "quantile" else report.ece
        curves.errorbar(conf[nonempty], acc[nonempty], yerr=_bin_wilson(acc[nonempty], counts[nonempty]), marker="o",
                        capsize=2, elinewidth=0.8, label=f"{name} (ECE {value:.3f}, {bins.strategy} bins)")
    curves.set_xlim(0, 1)
    curves.set_ylim(0, 1)
    curves.set_xlabel("mean confidence in bin")
    curves.set_ylabel("accuracy in bin")
    curves.set_title("Reliability")
    curves.legend(fontsize=8)

    metrics = ("ece", "ece_equal_mass", "mce", "brier", "nll")
    names = list(reports)
    width = 0.8 / len(names)
    x = np.arange(len(metrics))
    for i, name in enumerate(names):
        report = reports[name][0]
        values = np.array([getattr(report, m) for m in metrics], dtype=float)
        # The bootstrap intervals of the two ECEs, where computed (answers), as error bars.
        bounds = [(getattr(report, f"{m}_lo", None), getattr(report, f"{m}_hi", None)) for m in metrics]
        yerr = np.array([[v - lo if lo is not None else 0.0 for v, (lo, _) in zip(values, bounds)],
                         [hi - v if hi is not None else 0.0 for v, (_, hi) in zip(values, bounds)]]).clip(min=0.0)
        bars = scores.bar(x + i * width - 0.4 + width / 2, values, width=width, label=name, yerr=yerr, capsize=2,
                          error_kw={"elinewidth": 0.8})
        scores.bar_label(bars, fmt="%.3f", fontsize=7, rotation=90, padding=2)
    scores.set_xticks(x, ["ECE", "ECE (eq. mass)", "MCE", "Brier", "NLL"])
    scores.set_title("Lower is better")
    scores.legend(fontsize=8)
    scores.margins(y=0.2)
    fig.suptitle(title)
    return write_figure_atomic(fig, path)


def accuracy_coverage_png(
    curves: Mapping[str, SelectiveReport], path: Path, title: str = "Selective prediction: answer when confidence ≥ t",
) -> Path:
    """Accuracy against coverage as the confidence threshold rises, one line per model; the target accuracy and
    the point where each curve reaches it marked."""
    if not curves:
        raise ValueError("accuracy_coverage_png needs at least one curve; got none")
    fig = Figure(figsize=(7, 4.8))
    ax = fig.subplots()
    target = None
    for name, sel in curves.items():
        (line,) = ax.plot(sel.curve_coverage, sel.curve_accuracy, drawstyle="steps-post",
                          label=f"{name} (AURC {sel.aurc:.3f})")
        target = sel.target_accuracy
        if sel.coverage_at_target is not None:
            ax.scatter([sel.coverage_at_target], [sel.accuracy_at_target], color=line.get_color(), zorder=3, s=25)
    if target is not None:
        ax.axhline(target, ls="--", color="grey", lw=1, label=f"target accuracy {target:.2f}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("coverage (share of questions answered)")
    ax.set_ylabel("accuracy of the answered ones")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return write_figure_atomic(fig, path)


def _legend_below(ax) -> None:
    """The legend under the axes, in one row where it fits: bars reach every edge of a funnel's axes."""
    n = len(ax.get_legend_handles_labels()[1])
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17 if ax.get_xlabel() else -0.08),
              ncol=min(n, 5), frameon=False)


def funnel_png(funnel: Mapping[str, Mapping[str, int]], path: Path, title: str = "Data funnel") -> Path:
    """Where each source's documents ended (stacked bars), plus removal counts per reason."""
    return write_figure_atomic(funnel_figure(funnel, title), path)


def funnel_figure(funnel: Mapping[str, Mapping[str, int]], title: str = "Data funnel") -> Figure:
    """The figure of `funnel_png`."""
    if not funnel:
        raise ValueError("funnel_png needs at least one source; got an empty funnel")
    sources = list(funnel)
    reasons = sorted({k for row in funnel.values() for k in row if ":" in k and row[k] > 0})
    fig = Figure(figsize=(12 if reasons else 7, max(3.0, 0.6 * max(len(sources), len(reasons)) + 2)), layout="constrained")
    axes = fig.subplots(1, 2 if reasons else 1, squeeze=False)[0]
    ax = axes[0]
    y = np.arange(len(sources))
    fates = [f for f in _FUNNEL_FATES if any(f in row for row in funnel.values())]
    if fates:
        left = np.zeros(len(sources))
        for fate in fates:
            vals = np.array([funnel[s].get(fate, 0) for s in sources], dtype=float)
            ax.barh(y, vals, left=left, label=fate)
            left += vals
        ax.set_xlabel("documents")
    else:
        # A funnel without the usual fates: show each counter side by side.
        counters = sorted({k for row in funnel.values() for k in row if ":" not in k})
        h = 0.8 / max(1, len(counters))
        for i, counter in enumerate(counters):
            ax.barh(y + i * h - 0.4 + h / 2, [funnel[s].get(counter, 0) for s in sources], height=h, label=counter)
    ax.set_yticks(y, sources)
    ax.invert_yaxis()
    _legend_below(ax)
    ax.set_title(title)
    if reasons:
        rx = axes[1]
        ry = np.arange(len(reasons))
        left = np.zeros(len(reasons))
        for s in sources:
            vals = np.array([funnel[s].get(r, 0) for r in reasons], dtype=float)
            rx.barh(ry, vals, left=left, label=s)
            left += vals
        rx.set_yticks(ry, reasons, fontsize=8)
        rx.invert_yaxis()
        rx.set_xlabel("documents removed")
        rx.set_title("Removed, by reason")
        _legend_below(rx)
    return fig
