"""infra.tracking.store_errors: MLflow's store on a full disk is told apart from other failures and named."""
from __future__ import annotations

import errno
import sqlite3
from types import SimpleNamespace

from infra.tracking.store_errors import StoreFullError, store_full_error
from infra.workspace.paths import Workspace

RUN = SimpleNamespace(info=SimpleNamespace(run_id="r1"))


def test_a_full_sqlite_store_is_named_with_what_failed(tmp_path) -> None:
    ws = Workspace(tmp_path / "work")
    full = store_full_error(ws, f"sqlite:///{ws.mlflow_db}", RUN, sqlite3.OperationalError("database or disk is full"),
                            status="FAILED", after=RuntimeError("diverged"))
    assert isinstance(full, StoreFullError) and full.errno == errno.ENOSPC
    assert f"MLflow's store at {ws.mlflow_db} is on a full disk" in str(full)
    assert "run r1 could not be marked FAILED; the run had failed with: diverged" in str(full)


def test_other_failures_and_full_disks_elsewhere_are_not_the_store(tmp_path) -> None:
    ws = Workspace(tmp_path / "work")
    uri = "https://bob:pa55@mlflow.example/"
    assert store_full_error(ws, uri, RUN, RuntimeError("boom")) is None
    elsewhere = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "checkpoints" / "x.pt"))
    assert store_full_error(ws, uri, RUN, elsewhere) is None
    artifacts = OSError(errno.ENOSPC, "No space left on device", str(ws.mlflow_artifacts / "1" / "a.png"))
    full = store_full_error(ws, uri, RUN, artifacts)
    assert full is not None and "store at https://***@mlflow.example/ " in str(full)  # credentials hidden
