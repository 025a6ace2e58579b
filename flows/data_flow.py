"""The data flow: collect → decontaminate → (hold-out) → exact dedup → near dedup → quality filters → PII → mix →
shards.

Each stage is a stage object from `tasks/data/` (infra/stages.py) writing into its own
content-addressed folder (`work/data/<stage>/<key>/`), so a rerun with the same inputs,
config and code reuses completed stages and a variant never overwrites another.

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

from flows.config import DataConfig, resolve_data_config
from infra.config import config_hash
from infra.launch.ray_cluster import check_cluster, on_ray_task_runner, prefect_api_for_workers, ray_task_runner
from infra.lifecycle.signals import stop_on_cancel
from infra.stages import run, submit
from infra.tracking.runs import describe_overrides, stage_run
from infra.workspace.cache import flow_key
from infra.workspace.lock import workspace_lock
from infra.workspace.paths import Workspace
from tasks.data.catalog import load_catalog
from tasks.data.collect import Collect, MergeCollected, source_inputs
from tasks.data.decontaminate import Decontaminate
from tasks.data.exact_dedup import ExactDedup
from tasks.data.funnel import build_funnel
from tasks.data.holdout import Holdout
from tasks.data.mix import RebalanceMix
from tasks.data.near_dedup import NearDedup
from tasks.data.pii_redact import PiiRedact
from tasks.data.quality_filter import QualityFilter
from tasks.data.shards import WriteShards
from tasks.eval.items import EvalItems
from tasks.reports.data import data_report_markdown, log_data_run, publish_prefect_artifact


class DataResult(BaseModel):
    manifest: Path
    funnel: dict[str, dict[str, int]]
    mlflow_run_id: str
    held_out: dict[str, Path] = {}  # source -> its held-out texts (.jsonl), with data.holdout.fraction > 0
    decontamination: Path | None = None  # decontamination.json, when the run matched against any task
    contaminated: Path | None = None  # found.jsonl: the evaluation's items found in the collected documents


@flow(name="data", log_prints=True)
def data_flow(config: DataConfig | None = None, workdir: str | None = None, preset: str = "tiny",
              overrides: list[str] | None = None) -> DataResult:
    """Run the data stages with `config`, else the data section of `preset` plus `overrides` ("data.near.threshold=0.7");
    with a `config`, `overrides` are those already applied to it, naming the run.

    `workdir` None is the workspace of `Workspace.locate`: `$LLMFORGE_HOME`, else ./work.
    """
    config = resolve_data_config(config, preset, overrides, workdir)
    on_ray = config.executor == "ray"
    if on_ray and not on_ray_task_runner():
        return flow_for(config)(config, workdir=workdir, overrides=overrides)
    ws = Workspace.locate(workdir).ensure_writable()
    catalog = load_catalog(config.catalog, only=config.sources)  # a bad catalog fails before any work
    files = {s.name: source_inputs(catalog, s) for s in catalog.sources}  # listed once: the run's key and each source's
    # On Ray every stage is submitted (a Ray task); locally they run in this thread, where Ctrl-C lands.
    stage = (lambda st, **inputs: submit(st, ws, **inputs).result()) if on_ray else (lambda st, **inputs: run(st, ws, **inputs))
    with stop_on_cancel(), workspace_lock(ws), (prefect_api_for_workers() if on_ray else contextlib.nullcontext()) as api, stage_run(
        ws, "data", config, config_key="data", tags={"llmforge.config_hash": config_hash(config)},
        run_name=f"data {describe_overrides(overrides or [], 'data')}".strip(),
        run_key=flow_key("data", __name__, config, files),
    ) as run_:
        if on_ray:
            print(f"data stages on Ray: {len(check_cluster(ws.root, api))} node(s) see the workspace {ws.root}")
        # Each source keyed on its own definition and files: editing one re-collects that one only.
        pending = [submit(Collect(s, catalog), ws, files=files[s.name]) for s in catalog.sources]
        collected = stage(MergeCollected(), parts=[p.result() for p in pending])
        docs, held, decont = collected.output, None, None
        if not config.eval_items.empty:  # the evaluation's items out of the documents as they came in
            items = stage(EvalItems(config.eval_items), sources=[*config.eval_items.task_paths, *config.eval_items.files])
            decont = stage(Decontaminate(config.decontaminate), docs=docs, items=items.items)
            docs = decont.result.output
        if config.holdout.fraction > 0:  # set aside before any dedup or filter: unseen, raw
            held = stage(Holdout(config.holdout), docs=docs)
            docs = held.result.output
        exact = stage(ExactDedup(config.exact), docs=docs)
        near = stage(NearDedup(config.near), docs=exact.output) if config.near.enabled else None
        docs = (near or exact).output
        quality = stage(QualityFilter(catalog.filter_specs()), docs=docs) if config.quality.enabled else None
        pii = stage(PiiRedact(config.pii), docs=(quality.output if quality else docs))
        mixed = stage(RebalanceMix(config.mix), docs=pii.output, weights=catalog.weights(config.mix.weights),
                      max_epochs={s.name: s.max_epochs for s in catalog.sources})
        held_result = held.result if held else None
        decont_result = decont.result if decont else None
        funnel = build_funnel(collected, exact, near, quality, mixed, holdout=held_result, decontaminate=decont_result)
        manifest = stage(WriteShards(config.shards), docs=mixed.output, funnel=funnel, mix_report=mixed.report,
                         removed_files=[r.removed for r in (collected, decont_result, held_result, exact, near, quality,
                                                            mixed) if r],
                         config_hash=config_hash(config.outputs_identity()),
                         decontamination={k: v.model_dump() for k, v in decont.tasks.items()} if decont else {})
        publish_prefect_artifact(data_report_markdown(manifest))
        log_data_run(manifest, ws.run_reports(run_.info.run_id))
        print(data_report_markdown(manifest))
        return DataResult(manifest=manifest, funnel=funnel, mlflow_run_id=run_.info.run_id,
                          held_out=held.files if held else {}, decontamination=decont.report if decont else None,
                          contaminated=decont.found if decont else None)


def flow_for(config: DataConfig) -> Flow:
    """`data_flow` on the task runner `config.executor` names: Prefect's default, or Ray at `config.ray_address`."""
    if config.executor == "ray":
        return data_flow.with_options(task_runner=ray_task_runner(config.ray_address))
    return data_flow
