"""The whole pipeline, one subflow per stage (grows as stages land)."""
from __future__ import annotations

from prefect import flow

from flows.data_flow import data_flow
from flows.pretrain_flow import pretrain_flow
from infra.pipeline_config import PipelineConfig
from infra.paths import Workspace
from infra.tracking import stage_run


@flow(name="pipeline", log_prints=True)
def pipeline_flow(config: PipelineConfig = PipelineConfig(), workdir: str = "work") -> dict:
    ws = Workspace.from_env(workdir).ensure_writable()
    with stage_run(ws, "pipeline", config) as run:
        data = data_flow(config.data, workdir=str(ws.root))
        base = pretrain_flow(config.pretrain, manifest=str(data.manifest), workdir=str(ws.root))
        return {"mlflow_run_id": run.info.run_id, "manifest": str(data.manifest), "base_model": str(base.model_dir)}
