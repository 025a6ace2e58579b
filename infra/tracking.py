"""The one MLflow logging helper: tracking URI, experiment, nested stage runs, safe params,
and every kind of logging the stages and reports do (metrics, files, text, tags, dataset
inputs, registered models).

Everything that logs goes to the active run and calls `active_run()` first, so logging
outside `stage_run` is a clear error instead of MLflow silently opening a stray run.
"""
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

    active_run()
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
    all_tags = {"llmforge.stage": stage, **(tags or {})}
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


def active_run() -> Any:
    """The active MLflow run; a clear error instead of MLflow silently starting a stray run."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("no active MLflow run: log inside `with infra.tracking.stage_run(...)`")
    return run


def log_metrics(metrics: dict[str, float | int | None], step: int | None = None) -> None:
    """Log the finite values of `metrics` to the active run (None and NaN/inf are left out)."""
    import math

    import mlflow

    active_run()
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    if clean:
        mlflow.log_metrics(clean, step=step)


def log_artifact(path: Path | str, artifact_path: str | None = None) -> None:
    """Copy a file into the active run's artifacts."""
    import mlflow

    active_run()
    mlflow.log_artifact(str(path), artifact_path=artifact_path)


def log_artifacts(folder: Path | str, artifact_path: str | None = None) -> None:
    """Copy every file of `folder` into the active run's artifacts."""
    import mlflow

    active_run()
    mlflow.log_artifacts(str(folder), artifact_path=artifact_path)


def log_text(text: str, artifact_file: str) -> None:
    """Write `text` as the artifact `artifact_file` (e.g. "pretrain/token_index.json") of the active run."""
    import mlflow

    active_run()
    mlflow.log_text(text, artifact_file)


def set_tag(key: str, value: str) -> None:
    """Tag the active run."""
    import mlflow

    active_run()
    mlflow.set_tag(key, value)


def log_dataset_input(
    folder: Path, name: str, digest: str, context: str = "training", tags: dict[str, str] | None = None
) -> None:
    """Record the dataset in `folder` (by URI and digest, not its contents) as an input of the active run."""
    import warnings

    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    active_run()
    with warnings.catch_warnings():
        # MLflow registers the local-file source under two schemes and warns that they are ambiguous.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(Path(folder).resolve().as_uri())
    mlflow.log_input(MetaDataset(source=source, name=name, digest=digest), context=context, tags=tags)


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    """Every (step, value) logged for metric `key` in run `run_id`, by step; empty when never logged."""
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in sorted(MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)]


def register_model(
    model_dir: Path, name: str, tags: dict[str, str], description: str, artifact_path: str = "model"
) -> str:
    """Log `model_dir` to the active run under `artifact_path` and register it as a new version of `name`.

    The registered model is created on first use; returns the new version number.
    """
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    run = active_run()
    mlflow.log_artifacts(str(model_dir), artifact_path=artifact_path)
    client = MlflowClient()
    try:
        client.create_registered_model(name, description=description)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    source = f"{run.info.artifact_uri}/{artifact_path}"
    version = client.create_model_version(name, source=source, run_id=run.info.run_id, tags=tags)
    return str(version.version)
