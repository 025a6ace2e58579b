"""The one MLflow logging helper: tracking URI, experiment, parent/nested runs, safe params."""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.config import flatten_params
from infra.paths import Workspace

DEFAULT_EXPERIMENT = "llmforge"
_SECRET_KEY = re.compile(r"(token|secret|password|passwd|api_key|apikey|credential)", re.I)
_URI_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def tracking_uri(ws: Workspace) -> str:
    """`MLFLOW_TRACKING_URI` when set, else a SQLite store inside the workspace."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def redact(key: str, value: str) -> str:
    """Never write secrets to MLflow: blank secret-looking keys and user:password in URIs."""
    if _SECRET_KEY.search(key):
        return "***"
    return _URI_USERINFO.sub(r"\g<scheme>***@", value)


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
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
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


def log_config(cfg: BaseModel | dict[str, Any], prefix: str = "") -> None:
    """Log a (nested) config as flat, redacted MLflow params."""
    import mlflow

    params = {k: redact(k, v)[:6000] for k, v in flatten_params(cfg, prefix).items()}
    items = list(params.items())
    for i in range(0, len(items), 100):  # MLflow caps params per batch
        mlflow.log_params(dict(items[i : i + 100]))


@contextlib.contextmanager
def stage_run(
    ws: Workspace,
    stage: str,
    config: BaseModel | dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
) -> Iterator[Any]:
    """One MLflow run for a stage, nested under the active (pipeline) run when there is one.

    `run_id` resumes an existing run (e.g. a DeepSpeed rank-0 process continuing the
    run its Prefect task opened).
    """
    import mlflow

    experiment_id = configure(ws)
    parent = mlflow.active_run()
    parent_id = os.environ.get("LLMFORGE_PARENT_RUN_ID")
    all_tags = {"llmforge.stage": stage, **(tags or {})}
    if parent is None and parent_id and run_id is None:
        all_tags["mlflow.parentRunId"] = parent_id
    with mlflow.start_run(
        run_id=run_id,
        # Without it a new run lands in MLflow's "Default" experiment, not ours.
        experiment_id=None if run_id else experiment_id,
        run_name=None if run_id else stage,
        nested=parent is not None,
        tags=all_tags if run_id is None else None,
    ) as run:
        if config is not None and run_id is None:
            log_config(config)
        yield run


def log_artifact_file(path: Path, artifact_path: str | None = None) -> None:
    import mlflow

    mlflow.log_artifact(str(path), artifact_path=artifact_path)
