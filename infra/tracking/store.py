"""The workspace's MLflow store: its URI, its experiment, MLflow pointed at it, and its runs read back."""
from __future__ import annotations

import os
from typing import Any

from infra.workspace.paths import Workspace

# mlflow is imported inside the functions that use it: `llmforge runs` reading the store's SQLite tables straight
# (infra/tracking/index.py) and `llmforge --help` do not pay for its import.

DEFAULT_EXPERIMENT = "llmforge"  # the experiment a workspace's runs go to, unless MLFLOW_EXPERIMENT_NAME names another


def experiment_name() -> str:
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


def tracking_uri(ws: Workspace) -> str:
    """`MLFLOW_TRACKING_URI` when set, else a SQLite store inside the workspace."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def configure(ws: Workspace, experiment: str | None = None) -> str:
    """Point MLflow at the workspace store and make sure the experiment exists; returns its id."""
    import mlflow

    ws.root.mkdir(parents=True, exist_ok=True)
    user_uri = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri(ws))
    if user_uri is None:
        # MLflow 3 also exports the URI to os.environ; undo that, or the next workspace
        # in this process would log to this one's store and lose its artifact location.
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    name = experiment or experiment_name()
    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        # With a SQLite backend MLflow would otherwise put artifacts under ./mlruns of the CWD.
        artifact_location = None
        if user_uri is None:
            ws.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
            artifact_location = ws.mlflow_artifacts.as_uri()
        try:
            return mlflow.create_experiment(name, artifact_location=artifact_location)
        except Exception:
            # Another process created it between our check and create.
            exp = mlflow.get_experiment_by_name(name)
            if exp is None:
                raise
    return exp.experiment_id


def workspace_runs(ws: Workspace) -> list[dict[str, Any]]:
    """Every run of the workspace's experiment, newest first: id, name, status, start, end, params, tags, metrics."""
    from mlflow.tracking import MlflowClient

    experiment_id = configure(ws)
    client = MlflowClient()
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token, order_by=["attribute.start_time DESC"])
        runs += [
            {"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status, "start_time": r.info.start_time,
             "end_time": r.info.end_time, "params": dict(r.data.params), "tags": dict(r.data.tags),
             "metrics": dict(r.data.metrics)}
            for r in page
        ]
        token = page.token
        if not token:
            return runs
