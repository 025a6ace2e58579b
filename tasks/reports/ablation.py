"""The ablation's report: per target, each variant's bits per byte over seeds and its difference from the baseline,
with the 95% interval and the verdict (report.md), and a picture of the same (ablation.png)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from tasks.reports.data import PublishedReport, publish_report

PLOT_FILE = "ablation.png"


def _arms(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    arms = list(document["variants"].items())
    if document.get("aa"):
        arms.append(("aa (baseline again, other seeds)", document["aa"]))
    return arms


def _spread(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]  # a seed whose evaluation did not compute the metric
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def measures(document: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, what is measured, which way is better) of each table: the targets' bits per byte, then the metrics."""
    return ([(t, "bits/byte", "lower") for t in document["targets"]]
            + [(m, m.split(".", 1)[1], better) for m, better in document.get("metrics", {}).items()])


def ablation_markdown(document: dict[str, Any]) -> str:
    """One table per target and metric: mean ± sd over seeds, variant - baseline [95% interval], verdict."""
    lines = ["# Ablation", "", "Bits per byte on each held-out target (lower is better), then each metric of the "
             "evaluation: the mean over seeds ± their standard deviation, the difference from the baseline with its 95% "
             "interval (bits per byte: seed and window noise, paired by seed and by window; a metric: paired by seed), "
             "and the verdict: `better` or `worse` only when the interval excludes 0.", ""]
    for key, unit, better in measures(document):
        title = key if unit == "bits/byte" else f"{key} ({better} is better)"
        lines += [f"## {title}", "", f"| variant | overrides | seeds | {unit} | − baseline | 95% interval | verdict |",
                  "|---|---|---:|---:|---:|---|---|"]
        for name, arm in _arms(document):
            values = arm["values"].get(key, [])
            overrides = ", ".join(f"`{k}={v}`" for k, v in arm["overrides"].items()) or "—"
            diff = arm["vs_baseline"].get(key)
            cells = ("—", "—", "—") if diff is None else ("n/a", "—", diff["verdict"]) if diff["diff"] is None else (
                f"{diff['diff']:+.4f}", f"[{diff['ci'][0]:+.4f}, {diff['ci'][1]:+.4f}]", f"**{diff['verdict']}**")
            lines.append(f"| {name} | {overrides} | {len(values)} | {_spread(values)} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


def ablation_figure(document: dict[str, Any]) -> Figure:
    """Each variant's difference from the baseline per target and metric, with its interval: one panel per unit."""
    arms = [(n, a) for n, a in _arms(document) if a["vs_baseline"]]
    measured = measures(document)
    panels = [p for p in ([m for m in measured if m[1] == "bits/byte"], [m for m in measured if m[1] != "bits/byte"])
              if p]
    rows_of = [len(p) * max(1, len(arms)) for p in panels]
    fig = Figure(figsize=(7, 1.2 * len(panels) + 0.45 * sum(rows_of)))
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=rows_of)[:, 0]
    for ax, panel in zip(axes, panels):
        rows, labels = 0, []
        for key, unit, better in panel:
            for name, arm in arms:
                d = arm["vs_baseline"][key]
                if d["diff"] is None:
                    continue
                colour = {"better": "tab:green", "worse": "tab:red"}.get(d["verdict"], "tab:gray")
                lo, hi = d["ci"] if all(c is not None and abs(c) < float("inf") for c in d["ci"]) else (d["diff"],) * 2
                ax.errorbar([d["diff"]], [rows], xerr=[[d["diff"] - lo], [hi - d["diff"]]], fmt="o", color=colour,
                            capsize=3)
                labels.append(f"{name} · {key}" + ("" if unit == "bits/byte" else f" ({better} is better)"))
                rows += 1
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_yticks(range(rows), labels)
        ax.invert_yaxis()
        ax.set_xlabel("bits per byte − baseline (95% interval; left of 0 is better)" if panel[0][1] == "bits/byte"
                      else "metric − baseline (95% interval)")
    axes[0].set_title("Variants against the baseline")
    fig.tight_layout()
    return fig


def publish_ablation_report(folder: Path, document: dict[str, Any]) -> PublishedReport:
    """report.md and ablation.png in the ablation's folder, logged to the active MLflow run and as a Prefect artifact."""
    return publish_report(folder, ablation_markdown(document), {PLOT_FILE: ablation_figure(document)}, "ablate", "ablation-report")
