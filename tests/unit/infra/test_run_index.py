"""The run summaries read straight from MLflow's SQLite tables are the ones MLflow's own `search_runs`
gives, on a store MLflow made: the schema the fast path assumes is MLflow's."""
from __future__ import annotations

import sqlite3

import pytest

from infra.tracking.index import RunNotFound, _mlflow_summaries, run_params, summaries
from infra.workspace.paths import Workspace


def test_sqlite_summaries_match_mlflows(tmp_path):
    from mlflow.tracking import MlflowClient

    ws = Workspace(tmp_path / "work")
    client = MlflowClient(tracking_uri=f"sqlite:///{ws.mlflow_db}")
    exp = client.create_experiment("llmforge", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(exp, run_name="pipeline near.threshold=0.7", tags={"llmforge.stage": "pipeline"}).info.run_id
    client.log_param(parent, "data.near.threshold", "0.7")
    client.log_metric(parent, "grpo.heldout_accuracy", 0.25)
    client.log_metric(parent, "grpo.heldout_accuracy", 0.5, step=1)
    client.log_metric(parent, "unrelated", 1.0)
    child = client.create_run(exp, run_name="data", tags={"mlflow.parentRunId": parent, "llmforge.out.data.k": "data/near/k",
                                                          "llmforge.stage": "data", "other": "x"}).info.run_id
    client.set_terminated(child, "FINISHED")
    client.delete_run(client.create_run(exp, run_name="deleted").info.run_id)
    client.create_run(client.create_experiment("another"), run_name="elsewhere")

    fast = summaries(ws)
    assert [(s.run_id, s.name) for s in fast] == [(child, "data"), (parent, "pipeline near.threshold=0.7")]
    assert fast[1].headline == ("grpo.heldout_accuracy", 0.5) and fast[0].parent_id == parent
    assert fast[0].outputs == ["data/near/k"] and "other" not in fast[0].tags
    assert fast == _mlflow_summaries(ws)
    assert run_params(ws, parent[:8])[1] == {"data.near.threshold": "0.7"}


def test_an_unknown_schema_falls_back_to_mlflow(tmp_path, monkeypatch):
    ws = Workspace(tmp_path)
    sqlite3.connect(ws.mlflow_db).close()
    monkeypatch.setattr("infra.tracking.index._mlflow_summaries", lambda ws: ["from mlflow"])
    assert summaries(ws) == ["from mlflow"]


def test_no_store_is_an_error_naming_the_workspace(tmp_path):
    with pytest.raises(RunNotFound, match=f"no MLflow store at {tmp_path}"):
        summaries(Workspace(tmp_path))
