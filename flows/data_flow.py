"""The data flow: collect → exact dedup → near dedup → quality filters → PII → mix → shards.

Each stage is a Prefect task from `tasks/`, cached on the content of its inputs and its
config, so a rerun with the same inputs skips completed stages.
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from infra.config import config_hash
from infra.paths import Workspace
from flows.config import DataConfig, resolve_data_config
from infra.stage_cache import cached, run_cached
from infra.tracking import stage_run
from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source_task, merge_collected_task, source_inputs
from tasks.data.exact_dedup import exact_dedup_task
from tasks.data.funnel import build_funnel
from tasks.data.minhash_dedup import near_dedup_task
from tasks.data.mix import rebalance_mix_task
from tasks.data.pii_redact import pii_redact_task
from tasks.data.quality_filter import quality_filter_task
from tasks.reports.data import data_report_markdown, log_data_run, publish_prefect_artifact
from tasks.data.shards import write_shards_task


class DataResult(BaseModel):
    manifest: Path
    funnel: dict[str, dict[str, int]]
    mlflow_run_id: str


def _outputs(result) -> list[Path]:
    return [p for p in (result.output, result.removed) if p is not None]


@flow(name="data", log_prints=True)
def data_flow(config: DataConfig | None = None, workdir: str | None = None, preset: str = "tiny",
              overrides: list[str] | None = None) -> DataResult:
    """Run the data stages with `config`, else the data section of `preset`, plus `overrides` ("data.near.threshold=0.7").

    `workdir` None is the workspace of `Workspace.locate`: `$LLMFORGE_HOME`, else ./work.
    """
    config = resolve_data_config(config, preset, overrides)
    ws = Workspace.locate(workdir).ensure_writable()
    catalog = load_catalog(config.catalog, only=config.sources)  # a bad catalog fails before any work
    stage = ws.stage_dir
    removed = ws.quarantine
    with stage_run(ws, "data", config, tags={"llmforge.config_hash": config_hash(config)}) as run:
        futures = [
            cached(collect_source_task, ws).submit(catalog, s, stage("collect"), source_inputs(catalog, s))
            for s in catalog.sources
        ]
        per_source = [f.result() for f in futures]
        collected = run_cached(merge_collected_task, ws, per_source, stage("collect") / "all.parquet", removed / "collect.parquet", outputs=_outputs)
        exact = run_cached(exact_dedup_task, ws, collected.output, stage("exact") / "docs.parquet", removed / "exact_dedup.parquet", config.exact, outputs=_outputs)
        near = run_cached(near_dedup_task, ws, exact.output, stage("near") / "docs.parquet", removed / "near_dedup.parquet", config.near, outputs=_outputs)
        quality = run_cached(quality_filter_task, ws, near.output, stage("quality") / "docs.parquet", removed / "quality.parquet", catalog.filter_specs(), outputs=_outputs)
        pii = run_cached(pii_redact_task, ws, quality.output, stage("pii") / "docs.parquet", config.pii, outputs=_outputs)
        weights = catalog.weights()
        epochs = {s.name: s.max_epochs for s in catalog.sources}
        mixed = run_cached(rebalance_mix_task, ws, pii.output, stage("mix") / "docs.parquet", removed / "mix.parquet", weights, epochs, config.mix, outputs=_outputs)
        funnel = build_funnel(collected, exact, near, quality, mixed)
        removed_files = [r.removed for r in (collected, exact, near, quality, mixed)]
        manifest = run_cached(
            write_shards_task, ws, mixed.output, ws.shards, config.shards, funnel, mixed.report, removed_files,
            config_hash(config), outputs=lambda m: [m],
        )
        publish_prefect_artifact(data_report_markdown(manifest))
        log_data_run(manifest, ws.reports)
        print(data_report_markdown(manifest))
        return DataResult(manifest=manifest, funnel=funnel, mlflow_run_id=run.info.run_id)
