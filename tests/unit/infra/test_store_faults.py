"""MLflow's store locked, read-only or not openable, and a rank's full disk: one line and the CLI's exit code
(issue 26, item 8)."""
from __future__ import annotations

import errno
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from infra.launch.launcher import LaunchDiskFull, LaunchStopped, launch_failure
from infra.tracking.store import configure
from infra.workspace.paths import Workspace
from tests.helpers.shared import shared_once


def _cli_runs(workdir: Path, capsys, command: str = "runs") -> tuple[int, list[str]]:
    code = main([command, "--workdir", str(workdir)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [line for line in err.splitlines() if line.startswith("error:")]


def _migrate(folder: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", str(folder / "artifacts")).engine.dispose()


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store with every migration applied and none of our experiments (its artifact location
    would name another folder): creating one takes ~7 s here, copying it nothing."""
    return shared_once(tmp_path_factory, "mlflow-migrated", _migrate) / "mlflow.db"


@pytest.fixture
def store(tmp_path, monkeypatch, migrated_store) -> Workspace:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ws = Workspace.locate(tmp_path / "ws")
    ws.root.mkdir(parents=True)
    shutil.copyfile(migrated_store, ws.mlflow_db)
    configure(ws)  # the experiment, with this workspace's artifact folder
    return ws


def test_a_locked_store_is_exit_3_naming_it(store, capsys):
    holder = sqlite3.connect(str(store.mlflow_db), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, e.g. a run stuck in a long transaction
    try:
        code, lines = _cli_runs(store.root, capsys)
    finally:
        holder.close()
    assert code == 3 and len(lines) == 1
    assert str(store.mlflow_db) in lines[0] and "locked" in lines[0] and "MLFLOW_TRACKING_URI" in lines[0]


def test_a_store_path_through_a_file_or_a_file_that_is_no_database_is_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/afile/mlflow.db")
    # `gc` opens the store through MLflow (`runs` reads SQLite itself and only says there is no store yet).
    code, lines = _cli_runs(tmp_path / "ws", capsys, "gc")
    assert code == 2 and len(lines) == 1 and "afile is a file, not a folder" in lines[0]
    not_db = tmp_path / "notdb.db"
    not_db.write_bytes(b"not a database\n" * 100)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{not_db}")
    code, lines = _cli_runs(tmp_path / "ws", capsys, "gc")
    assert code == 2 and len(lines) == 1 and "not an SQLite database" in lines[0] and str(not_db) in lines[0]


def test_gc_of_a_mistyped_workdir_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, lines = _cli_runs(tmp_path / "typo", capsys, "gc")
    assert code == 2 and len(lines) == 1 and f"no MLflow store at {tmp_path / 'typo' / 'mlflow.db'}" in lines[0]
    assert not (tmp_path / "typo").exists()


def test_a_tracking_uri_of_an_unknown_scheme_or_a_dead_server_is_one_line(store, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "garbage://x")
    code, lines = _cli_runs(store.root, capsys)
    assert code == 2 and len(lines) == 1 and "MLflow has no store of scheme 'garbage'" in lines[0]
    from infra.lifecycle.preflight import check_tracking_store

    check_tracking_store({"MLFLOW_TRACKING_URI": "postgresql+psycopg2://user@db/mlflow"})  # a dialect+driver: known
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")  # nothing listens on port 1
    code, lines = _cli_runs(store.root, capsys)
    assert code == 3 and len(lines) == 1 and "MLflow server at http://127.0.0.1:1/health is not answering" in lines[0]
    other = store.root / "other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")
    code, lines = _cli_runs(store.root, capsys)
    assert code == 2 and len(lines) == 1 and f"no MLflow store at {other} (MLFLOW_TRACKING_URI)" in lines[0]


def test_a_read_only_store_is_exit_3(store, tmp_path, monkeypatch, capsys):
    view = tmp_path / "ro"
    view.mkdir()
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(store.root), str(view)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here ({done.stderr.strip()}); needs root with CAP_SYS_ADMIN")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        # The store read-only, the workspace writable; a new experiment is a write.
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{view / store.mlflow_db.name}")
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "another")
        code, lines = _cli_runs(tmp_path / "ws2", capsys, "gc")  # reading a read-only store (`runs`) is fine
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
    assert code == 3 and len(lines) == 1 and "read-only" in lines[0], lines


def test_a_rank_out_of_disk_space_fails_the_launch_as_enospc():
    from tasks.training.checkpoint import disk_full_error

    rank_error = disk_full_error(Path("/ckpt/step_4"), needed=10 << 20, free=1 << 20, previous=Path("/ckpt/step_2"),
                                 keep=2, written=2 << 20)
    tail = ["Traceback (most recent call last):", '  File "loop.py", line 1, in fit',
            f"OSError: {rank_error}", "[launch.py] exits with return code = 1"]
    exc = launch_failure("tasks.training.pretrain.worker", 1, 1, tail)
    assert isinstance(exc, LaunchDiskFull) and isinstance(exc, RuntimeError) and exc.errno == errno.ENOSPC
    assert "saving checkpoint /ckpt/step_4" in str(exc) and "\n" not in str(exc)
    plain = launch_failure("m", 2, 1, ["ValueError: bad"])
    assert type(plain) is RuntimeError and "ValueError: bad" in str(plain)


def test_the_cli_exits_4_on_a_launch_out_of_disk_space(monkeypatch, capsys):
    def full(*args, **kwargs):
        raise launch_failure("tasks.training.pretrain.worker", 1, 1, ["OSError: [Errno 28] No space left on device"])

    monkeypatch.setattr("flows.cli._runs", full)
    assert main(["runs"]) == 4
    assert capsys.readouterr().err.count("error:") == 1


def test_a_launch_the_runs_stop_ended_is_no_failure_and_logs_no_traceback(monkeypatch):
    """SIGTERM to a flow of queued launches: the other launches end too, said without a traceback (issue 52)."""
    import logging

    from flows.cli import _UserErrorsInOneLine

    assert type(launch_failure("m", 1, -15, ["x"])) is RuntimeError
    monkeypatch.setattr("infra.launch.launcher.run_stopping", lambda: True)
    exc = launch_failure("m", 1, -15, ["x"])
    assert isinstance(exc, LaunchStopped) and "stopped with the run (exit code -15)" in str(exc)
    record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None, (type(exc), exc, None))
    assert _UserErrorsInOneLine().filter(record) and record.exc_info is None
