"""The ablation's report: per target, each variant's bits per byte over seeds and its difference from the baseline,
with the 95% interval and the verdict (report.md), and a picture of the same (ablation.png)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from pydantic import BaseModel

from infra.tracking.runs import log_artifacts
from infra.workspace.atomic import write_figure_atomic, write_text_atomic
from tasks.reports.data import publish_prefect_artifact

REPORT_FILE = "report.md"
PLOT_FILE = "ablation.png"


class AblationReport(BaseModel):
    path: Path
    markdown: str


def _arms(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    arms = list(document["variants"].items())
    if document.get("aa"):
        arms.append(("aa (baseline again, other seeds)", document["aa"]))
    return arms


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def ablation_markdown(document: dict[str, Any]) -> str:
    """One table per target: mean ± sd over seeds, variant - baseline [95% interval], verdict."""
    lines = ["# Ablation", "", "Bits per byte on each held-out target (lower is better): the mean over seeds ± their "
             "standard deviation, the difference from the baseline with its 95% interval (seed and window noise, "
             "paired by seed and by window), and the verdict: `better` or `worse` only when the interval excludes 0.", ""]
    for target in document["targets"]:
        lines += [f"## {target}", "", "| variant | overrides | seeds | bits/byte | − baseline | 95% interval | verdict |",
                  "|---|---|---:|---:|---:|---|---|"]
        for name, arm in _arms(document):
            values = arm["values"].get(target, [])
            overrides = ", ".join(f"`{k}={v}`" for k, v in arm["overrides"].items()) or "—"
            diff = arm["vs_baseline"].get(target)
            cells = ("—", "—", "—") if diff is None else (
                f"{diff['diff']:+.4f}", f"[{diff['ci'][0]:+.4f}, {diff['ci'][1]:+.4f}]", f"**{diff['verdict']}**")
            lines.append(f"| {name} | {overrides} | {len(values)} | {_spread(values)} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


def ablation_figure(document: dict[str, Any]) -> Figure:
    """Each variant's difference from the baseline per target, with its interval: left of 0 is better."""
    arms = [(n, a) for n, a in _arms(document) if a["vs_baseline"]]
    targets = document["targets"]
    fig = Figure(figsize=(7, 1.0 + 0.45 * max(1, len(arms)) * len(targets)))
    ax = fig.subplots()
    rows, labels = 0, []
    for target in targets:
        for name, arm in arms:
            d = arm["vs_baseline"][target]
            colour = {"better": "tab:green", "worse": "tab:red"}.get(d["verdict"], "tab:gray")
            ax.errorbar([d["diff"]], [rows], xerr=[[d["diff"] - d["ci"][0]], [d["ci"][1] - d["diff"]]], fmt="o",
                        color=colour, capsize=3)
            labels.append(f"{name} · {target}")
            rows += 1
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(range(rows), labels)
    ax.invert_yaxis()
    ax.set_xlabel("bits per byte − baseline (95% interval; left of 0 is better)")
    ax.set_title("Variants against the baseline")
    return fig


def publish_ablation_report(folder: Path, document: dict[str, Any]) -> AblationReport:
    """report.md and ablation.png in the ablation's folder, logged to the active MLflow run and as a Prefect artifact."""
    folder = Path(folder)
    markdown = ablation_markdown(document)
    path = write_text_atomic(folder / REPORT_FILE, markdown)
    write_figure_atomic(ablation_figure(document), folder / PLOT_FILE)
    log_artifacts(folder, artifact_path="ablate")
    publish_prefect_artifact(markdown, key="ablation-report")
    return AblationReport(path=path, markdown=markdown)
