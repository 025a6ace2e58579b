"""The data flow: collect → exact dedup → near dedup → quality filters → PII → mix → shards.

Each stage is a Prefect task from `tasks/data/` writing into its own content-addressed
folder (`work/data/<stage>/<key>/`, infra/stage_cache.py), so a rerun with the same
inputs, config and code reuses completed stages and a variant never overwrites another.

With `data.executor=ray` the same stages run on Prefect's Ray task runner, each a Ray task,
their batch jobs spread over the cluster (tasks/data/parallel.py); the outputs are the same
files. A caller that sets no runner (the pipeline, a deployment) gets the flow rerun as its
own subflow on the Ray runner; `flow_for(config)` gives the flow with it set.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from prefect import Flow, flow
from pydantic import BaseModel

from infra.config import config_hash
from infra.paths import Workspace
from flows.config import DataConfig, resolve_data_config
from infra.ray_cluster import check_cluster, on_ray_task_runner, prefect_api_for_workers, ray_task_runner
from infra.stage_cache import flow_key, OUT, run_cached, submit_cached
from infra.tracking import describe_overrides, stage_run
from infra.run_signals import stop_on_cancel
from infra.workspace_lock import workspace_lock
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


@flow(name="data", log_prints=True)
def data_flow(config: DataConfig | None = None, workdir: str | None = None, preset: str = "tiny",
              overrides: list[str] | None = None) -> DataResult:
    """Run the data stages with `config`, else the data section of `preset`, plus `overrides` ("data.near.threshold=0.7").

    `workdir` None is the workspace of `Workspace.locate`: `$LLMFORGE_HOME`, else ./work.
    """
    config = resolve_data_config(config, preset, overrides, workdir)
    on_ray = config.executor == "ray"
    if on_ray and not on_ray_task_runner():
        return flow_for(config)(config, workdir=workdir, overrides=overrides)
    ws = Workspace.locate(workdir).ensure_writable()
    catalog = load_catalog(config.catalog, only=config.sources)  # a bad catalog fails before any work
    # On Ray every stage is submitted (a Ray task); locally they run in this thread, where Ctrl-C lands.
    run_stage = (lambda *a, **kw: submit_cached(*a, **kw).result()) if on_ray else run_cached
    with stop_on_cancel(), workspace_lock(ws), (prefect_api_for_workers() if on_ray else contextlib.nullcontext()) as api, stage_run(
        ws, "data", config, config_key="data", tags={"llmforge.config_hash": config_hash(config)},
        run_name=f"data {describe_overrides(overrides or [], 'data')}".strip(),
        run_key=flow_key("data", __name__, config, {s.name: source_inputs(catalog, s) for s in catalog.sources}),
    ) as run:
        if on_ray:
            print(f"data stages on Ray: {len(check_cluster(ws.root, api))} node(s) see the workspace {ws.root}")
        # Each source keyed on its own definition and files: editing one re-collects that one only.
        pending = [
            submit_cached(collect_source_task, ws, "data/collect", catalog, s, OUT, source_inputs(catalog, s),
                          key_ignore=("catalog",))
            for s in catalog.sources
        ]
        per_source = [p.result() for p in pending]
        collected = run_stage(merge_collected_task, ws, "data/merge", per_source, OUT / "docs.parquet", OUT / "removed.parquet")
        exact = run_stage(exact_dedup_task, ws, "data/exact", collected.output, OUT / "docs.parquet", OUT / "removed.parquet", config.exact)
        near = run_stage(near_dedup_task, ws, "data/near", exact.output, OUT / "docs.parquet", OUT / "removed.parquet", config.near)
        quality = run_stage(quality_filter_task, ws, "data/quality", near.output, OUT / "docs.parquet", OUT / "removed.parquet", catalog.filter_specs())
        pii = run_stage(pii_redact_task, ws, "data/pii", quality.output, OUT / "docs.parquet", config.pii)
        weights = catalog.weights()
        epochs = {s.name: s.max_epochs for s in catalog.sources}
        mixed = run_stage(rebalance_mix_task, ws, "data/mix", pii.output, OUT / "docs.parquet", OUT / "removed.parquet", weights, epochs, config.mix)
        funnel = build_funnel(collected, exact, near, quality, mixed)
        removed_files = [r.removed for r in (collected, exact, near, quality, mixed)]
        manifest = run_stage(
            write_shards_task, ws, "data/shards", mixed.output, OUT, config.shards, funnel, mixed.report, removed_files,
            config_hash(config.outputs_identity()),
        )
        publish_prefect_artifact(data_report_markdown(manifest))
        log_data_run(manifest, ws.run_reports(run.info.run_id))
        print(data_report_markdown(manifest))
        return DataResult(manifest=manifest, funnel=funnel, mlflow_run_id=run.info.run_id)


def flow_for(config: DataConfig) -> Flow:
    """`data_flow` on the task runner `config.executor` names: Prefect's default, or Ray at `config.ray_address`."""
    if config.executor == "ray":
        return data_flow.with_options(task_runner=ray_task_runner(config.ray_address))
    return data_flow
