"""Register the pipeline's final model in the MLflow model registry, with its lineage.

The weights are logged as safetensors files (never a pickle) under the pipeline run, and a
model version points at them, tagged with the data manifest hash, tokenizer hash, config
hash and the run that made it.
"""
from __future__ import annotations

from pathlib import Path


def register_final_model(model_dir: Path, name: str, lineage: dict[str, str]) -> str:
    """Log `model_dir` to the active run and register it as a new version of `name`; returns the version."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("register_final_model needs an active MLflow run (the pipeline run)")
    mlflow.log_artifacts(str(model_dir), artifact_path="final_model")
    client = MlflowClient()
    try:
        client.create_registered_model(name, description="Final model of the llmforge pipeline (safetensors + config.json)")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    source = f"{run.info.artifact_uri}/final_model"
    version = client.create_model_version(name, source=source, run_id=run.info.run_id, tags=lineage)
    return str(version.version)
