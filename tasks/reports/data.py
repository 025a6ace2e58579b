"""Publish the data run: the funnel as a Prefect Markdown artifact, and MLflow metrics,
artifacts (manifest, funnel table and chart) and the shards as a dataset input."""
from __future__ import annotations

import warnings
from pathlib import Path

from tasks.data.funnel import funnel_markdown, funnel_totals
from tasks.data.manifest import load_manifest, sha256_file


def data_report_markdown(manifest_path: Path) -> str:
    m = load_manifest(manifest_path)
    lines = ["# Data funnel", "", funnel_markdown(m.funnel), "", "## Mix (target vs achieved)", ""]
    unit = m.mix.get("unit", "chars")
    lines += [f"| source | target | achieved | epochs | sampled {unit} |", "|---|---|---|---|---|"]
    for s, r in m.mix.get("sources", {}).items():
        lines.append(f"| {s} | {r['target']:.3f} | {r['achieved']:.3f} | {r['epochs']:.2f} | {r['sampled']} |")
    lines += ["", f"{len(m.shards)} shard(s), {m.stats.get('rows', 0)} rows, in `{Path(manifest_path).parent}`"]
    return "\n".join(lines)


def publish_prefect_artifact(markdown: str, key: str = "data-funnel") -> None:
    """Attach the report to the current Prefect flow run (no-op outside a run)."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.context import get_run_context

    try:
        get_run_context()
    except Exception:
        return
    create_markdown_artifact(markdown=markdown, key=key, description="Where every collected document ended")


def log_data_run(manifest_path: Path, out_dir: Path) -> dict[str, float]:
    """Log funnel metrics, the manifest, the funnel table/chart and the dataset input to the active MLflow run."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

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
    mlflow.log_metrics(metrics)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "data_report.md"
    md.write_text(data_report_markdown(manifest_path))
    mlflow.log_artifact(str(manifest_path), artifact_path="data")
    mlflow.log_artifact(str(md), artifact_path="data")
    try:
        from tasks.reports.plots import funnel_png

        png = funnel_png(m.funnel, out_dir / "funnel.png")
        mlflow.log_artifact(str(png), artifact_path="data")
    except ImportError:
        pass
    digest = sha256_file(Path(manifest_path))[:16]
    with warnings.catch_warnings():
        # MLflow registers the local-file source under two schemes and warns that they are ambiguous.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(Path(manifest_path).parent.resolve().as_uri())
    dataset = MetaDataset(source=source, name="pretraining-shards", digest=digest)
    mlflow.log_input(dataset, context="training", tags={"manifest_sha256": digest, "rows": str(m.stats.get("rows", 0))})
    mlflow.set_tag("llmforge.manifest", str(Path(manifest_path).resolve()))
    return metrics

