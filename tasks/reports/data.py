"""Publish the data run: its funnel to Prefect, and its metrics, artifacts and dataset input to MLflow.

The funnel as a Prefect Markdown artifact; MLflow metrics, artifacts (manifest, funnel table and chart)
and the shards as a dataset input.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.tracking.provenance import artifact_key
from infra.tracking.datasets import log_shards_input
from infra.tracking.runs import active_run, log_artifact, log_artifacts, log_metrics, set_tag
from infra.workspace.atomic import write_figure_atomic, write_json_atomic, write_text_atomic
from tasks.data.funnel import funnel_markdown, funnel_totals
from tasks.data.manifest import load_manifest
from tasks.reports.plots import funnel_png

# prefect is imported inside the functions that use it: a rank, `llmforge --help` and the CLI's quick errors do not
# pay for its import.


def data_report_markdown(manifest_path: Path) -> str:
    """The data report: the funnel, the mix (target vs achieved) and the shards written."""
    m = load_manifest(manifest_path)
    lines = ["# Data funnel", "", funnel_markdown(m.funnel), "", "## Mix (target vs achieved)", ""]
    unit = m.mix.get("unit", "chars")
    lines += [f"| source | target | achieved | epochs | sampled {unit} |", "|---|---|---|---|---|"]
    for s, r in m.mix.get("sources", {}).items():
        lines.append(f"| {s} | {r['target']:.3f} | {r['achieved']:.3f} | {r['epochs']:.2f} | {r['sampled']} |")
    lines += ["", f"{len(m.shards)} shard(s), {m.stats.get('rows', 0)} rows, in `{Path(manifest_path).parent}`"]
    if m.decontamination:
        lines += ["", decontamination_markdown(m.decontamination)]
    return "\n".join(lines)


def decontamination_markdown(tasks: Mapping[str, Mapping[str, Any]]) -> str:
    """Per evaluation task: its items found in the collected documents, and what was removed or cut."""
    lines = ["## Decontamination", "",
             "| task | items | items found | documents removed | documents cut | common n-grams ignored | numbers |",
             "|---|---|---|---|---|---|---|"]
    for name, t in tasks.items():
        lines.append(f"| {name} | {t['items']} | {t['items_found']} ({t['items_found'] / max(t['items'], 1):.1%}) | "
                     f"{t['documents_removed']} | {t['documents_cut']} | {t['common_ngrams_ignored']} | {t['numbers']} |")
    return "\n".join(lines)


class PublishedReport(BaseModel):
    """A flow's report.md and its text."""

    path: Path
    markdown: str


def publish_report(folder: Path, markdown: str, figures: Mapping[str, Any], artifact_path: str,
                   key: str) -> PublishedReport:
    """A flow's report.md and its figures (file name -> matplotlib Figure) in `folder`, the folder logged to the active
    MLflow run under `artifact_path` and the markdown attached to the Prefect flow run as `key`."""
    folder = Path(folder)
    path = write_text_atomic(folder / "report.md", markdown)
    for name, figure in figures.items():
        write_figure_atomic(figure, folder / name)
    log_artifacts(folder, artifact_path=artifact_path)
    publish_prefect_artifact(markdown, key=key)
    return PublishedReport(path=path, markdown=markdown)


def publish_prefect_artifact(markdown: str, key: str = "funnel") -> str | None:
    """Attach the report to the current Prefect flow run as `<flow>-<key>` ("data-funnel", "pipeline-report");
    None outside a run. The key names the flow and the report, never the run, so every run adds a version of
    one artifact and Prefect shows its history; the description names the run."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.context import FlowRunContext


    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    run = ctx.flow_run
    flow_name = ctx.flow.name if ctx.flow is not None else "llmforge"
    stable = artifact_key(flow_name, key)
    create_markdown_artifact(markdown=narrow_tables(markdown), key=stable, description=f"{key} of flow run {run.name}")
    return stable


_CELL_SEP = re.compile(r"(?<!\\)\|")  # a cell boundary: a pipe the cell's text did not escape as \|


def narrow_tables(markdown: str, max_columns: int = 6, max_chars: int = 90) -> str:
    """Transpose each Markdown table wider than `max_columns` that has fewer rows than columns, and write each
    other table with a row longer than `max_chars` characters as a list (`- label: value`, or `- label: base 1.2 ·
    sft 1.1` for several value columns).

    Prefect's artifact page clips a table at its panel's width and does not wrap its cells: the funnel's
    last columns, and the report card's headline values and the calibration table's SFT and GRPO columns to
    the right of their long labels, would be out of sight. Transposed, a wide table keeps every column as a
    row; as a list, a label and its values wrap.
    """
    lines, out, i = markdown.split("\n"), [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            j += 1
        if j == i:
            out.append(lines[i])
            i += 1
            continue
        rows = [[c.strip() for c in _CELL_SEP.split(line.strip().removeprefix("|").removesuffix("|"))]
                for line in lines[i:j]]
        header, body = rows[0], rows[2:]
        rectangular = all(len(r) == len(header) for r in body)
        if len(header) > max_columns and len(body) + 1 < len(header) and rectangular:
            columns = list(zip(header, *body))
            out.append("| " + " | ".join(columns[0]) + " |")
            out.append("|---" * len(columns[0]) + "|")
            out += ["| " + " | ".join(col) + " |" for col in columns[1:]]
        elif rectangular and any(len(" ".join(r)) > max_chars for r in body):
            heading = " — ".join(f"**{h}**" for h in (header if len(header) == 2 else header[:1]) if h)
            out += [heading, ""] if heading else []
            out += [f"- {r[0]}: {_row_values(header, r)}" if any(r[1:]) else f"- {r[0]}" for r in body]
        else:
            out += lines[i:j]
        i = j
    return "\n".join(out)


def _row_values(header: list[str], row: list[str]) -> str:
    """A table row's values after its label: the value alone beside one column, else each after its column's name."""
    if len(row) == 2:
        return row[1]
    return " · ".join(f"{h} {v}" for h, v in zip(header[1:], row[1:]) if v)


def funnel_metrics(manifest_path: Path) -> dict[str, float]:
    """The manifest as flat metrics: funnel counts per source and in total, mix target vs achieved, shard totals."""
    m = load_manifest(manifest_path)
    metrics: dict[str, float] = {}
    for source, row in m.funnel.items():
        for k, v in row.items():
            metrics[f"funnel.{source}.{k.replace(':', '.')}"] = float(v)
    for k, v in funnel_totals(m.funnel).items():
        metrics[f"funnel.total.{k.replace(':', '.')}"] = float(v)
    for source, r in m.mix.get("sources", {}).items():
        metrics[f"mix.{source}.target"] = float(r["target"])
        metrics[f"mix.{source}.achieved"] = float(r["achieved"])
    metrics["shards.count"] = float(len(m.shards))
    metrics["shards.rows"] = float(m.stats.get("rows", 0))
    return metrics


def log_data_run(manifest_path: Path, out_dir: Path) -> dict[str, float]:
    """Log funnel metrics, the manifest, the funnel table/chart and the dataset input to the active MLflow run."""
    run = active_run()
    manifest_path = Path(manifest_path)
    m = load_manifest(manifest_path)
    metrics = funnel_metrics(manifest_path)
    log_metrics(metrics)
    md = write_text_atomic(out_dir / "data_report.md", data_report_markdown(manifest_path))
    png = funnel_png(m.funnel, out_dir / "funnel.png")
    written = [manifest_path, md, png]
    if m.decontamination:
        written.append(write_json_atomic(out_dir / "decontamination.json", {"tasks": m.decontamination}))
        log_metrics({f"decontamination.{task}.{k}": float(v) for task, t in m.decontamination.items()
                     for k, v in t.items() if isinstance(v, int)})
    for path in written:
        log_artifact(path, artifact_path="data")
    log_shards_input(run.info.run_id, manifest_path, tags={"rows": str(m.stats.get("rows", 0))})
    set_tag("llmforge.manifest", str(manifest_path.resolve()))
    return metrics
