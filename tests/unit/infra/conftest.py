"""Fixtures of the infra tests."""
from __future__ import annotations

import pytest

from infra.workspace.paths import Workspace


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Workspace:
    """A fresh workspace whose MLflow store is its own SQLite file (no tracking URI, experiment or flow run set)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    return Workspace(tmp_path / "work")
