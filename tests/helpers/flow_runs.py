"""A flow of many runs as MLflow holds it: its one parent run and the stage runs nested under it."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def parent_and_children(work: Path, flow: str, child_stage: str = "pretrain") -> tuple[Any, list[Any]]:
    """The workspace's only `flow` run (asserted) and its nested `child_stage` runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(work) / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("llmforge").experiment_id])
    parents = [r for r in runs if r.data.tags.get("llmforge.stage") == flow]
    assert len(parents) == 1, [r.data.tags.get("llmforge.stage") for r in runs]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
                and r.data.tags.get("llmforge.stage") == child_stage]
    return parents[0], children
