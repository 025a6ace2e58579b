"""A run that did not finish is continued by the next attempt with the same key (one MLflow
run per model, its metrics by step in one place); after a finished one, the repeat says so."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from infra.tracking.runs import log_metrics, stage_run
from infra.workspace.paths import Workspace


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Workspace:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return Workspace(tmp_path / "work")


class Crash(Exception):
    pass


def test_a_failed_attempt_is_continued_then_a_repeat_is_linked(ws):
    with pytest.raises(Crash):
        with stage_run(ws, "pretrain", {"lr": 1.0}, run_key="k1") as first:
            log_metrics({"loss": 3.0}, step=1)
            raise Crash
    with stage_run(ws, "pretrain", {"lr": 1.0}, run_key="k1") as second:
        log_metrics({"loss": 2.0}, step=2)
    assert second.info.run_id == first.info.run_id
    client = MlflowClient()
    run = client.get_run(first.info.run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]

    with stage_run(ws, "pretrain", {"lr": 1.0}, run_key="k1") as third:
        pass
    repeat = client.get_run(third.info.run_id)
    assert third.info.run_id != first.info.run_id
    assert repeat.data.tags["llmforge.repeat_of"] == first.info.run_id
    assert first.info.run_id in repeat.data.tags["mlflow.note.content"]

    with stage_run(ws, "pretrain", {"lr": 2.0}, run_key="k2") as other:
        pass
    assert "llmforge.repeat_of" not in client.get_run(other.info.run_id).data.tags
