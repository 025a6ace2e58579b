"""What `llmforge runs` reads: a summary of every run of the workspace's experiment, in one pass.

A summary is what a person scans a list for: id, name, status, start and end, parent run,
description, output folders and one headline metric; never the 170 params of a pipeline run.
With the default store (SQLite in the workspace) it is read with `sqlite3` straight from
MLflow's tables, three queries in all: importing MLflow alone takes longer than the 3 s a
listing of 100 runs may take on a small machine, and `search_runs` loads every param, tag
and metric of every run. Any other store (a tracking server), or a schema this reader does
not know, goes through MLflow's `search_runs`.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from infra.tracking.store import configure, experiment_name, workspace_runs
from infra.workspace.paths import Workspace

# MLflow is imported only on the slow path, a store that is not the workspace's SQLite file (infra/tracking/store.py
# imports it inside its functions): importing MLflow alone takes longer than reading the tables.

OUT_TAG = "llmforge.out."
PARENT_TAG = "mlflow.parentRunId"
NOTE_TAG = "mlflow.note.content"
# The tags a summary keeps (besides the output folders).
SUMMARY_TAGS = (PARENT_TAG, NOTE_TAG, "llmforge.stage", "llmforge.repeat_of")
# A run's headline: the first of these it logged. The pipeline's and GRPO's held-out accuracy,
# the evaluation's accuracy of the final model, training's validation perplexity, the data's rows;
# `grpo/heldout_accuracy`, `grpo.heldout_accuracy` and `val_ppl` are the names runs of older versions logged.
HEADLINE_METRICS = ("grpo/heldout_accuracy_after", "grpo/heldout_accuracy", "grpo.heldout_accuracy",
                    "heldout_accuracy_after", "grpo.answer.accuracy", "answer.accuracy", "final_val_ppl", "val_ppl",
                    "shards.rows")


class RunNotFound(LookupError):
    """A run id (prefix) that matches no run, or several."""


@dataclass
class RunSummary:
    run_id: str
    name: str
    status: str
    start_ms: int | None
    end_ms: int | None
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def parent_id(self) -> str | None:
        return self.tags.get(PARENT_TAG)

    @property
    def outputs(self) -> list[str]:
        """The output folders (relative to the workspace) the run's tags name."""
        return sorted(v for k, v in self.tags.items() if k.startswith(OUT_TAG))

    @property
    def headline(self) -> tuple[str, float] | None:
        for key in HEADLINE_METRICS:
            if key in self.metrics:
                return key, self.metrics[key]
        return None


def sqlite_store(ws: Workspace) -> Path | None:
    """The SQLite file of the workspace's MLflow store, or None when MLflow is pointed elsewhere."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return ws.mlflow_db
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):])
    return None


def no_store_error(ws: Workspace, db: Path) -> RunNotFound:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return RunNotFound(f"no MLflow store at {db} (MLFLOW_TRACKING_URI): nothing has been logged there; unset "
                           f"it to read workspace {ws.root}'s own store, or point it at the store the runs used")
    return RunNotFound(f"no MLflow store at {db}: nothing has run in workspace {ws.root} yet; "
                       "give the workspace with --workdir or LLMFORGE_HOME")


def check_store_exists(ws: Workspace) -> None:
    """RunNotFound when no MLFLOW_TRACKING_URI is set and the workspace has no store of its own (a mistyped
    --workdir); a store MLFLOW_TRACKING_URI names is left to MLflow, whose faults infra/tracking/store_errors.py says."""
    if not os.environ.get("MLFLOW_TRACKING_URI") and not ws.mlflow_db.is_file():
        raise no_store_error(ws, ws.mlflow_db)


def summaries(ws: Workspace) -> list[RunSummary]:
    """Every active run of the workspace's experiment, newest first."""
    db = sqlite_store(ws)
    if db is not None:
        if not db.is_file():
            raise no_store_error(ws, db)
        try:
            return _sqlite_summaries(db, experiment_name())
        except sqlite3.DatabaseError as exc:
            if "database is locked" in str(exc):
                raise  # MLflow would wait as long again behind the same writer before failing the same way
            # a schema of another MLflow version: MLflow reads it
    return _mlflow_summaries(ws)


def run_params(ws: Workspace, prefix: str) -> tuple[RunSummary, dict[str, str]]:
    """The run whose id starts with `prefix` (RunNotFound unless exactly one does), and its params."""
    hits = [s for s in summaries(ws) if s.run_id.startswith(prefix.strip())] if prefix.strip() else []
    if len(hits) != 1:
        raise RunNotFound(f"run id '{prefix[:40]}' matches {len(hits)} runs of {ws.root}; give "
                          f"{'more of it' if hits else 'an id or prefix that `llmforge runs` lists'}")
    run = hits[0]
    db = sqlite_store(ws)
    if db is not None:
        try:
            with _read_only(db) as con:
                return run, dict(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run.run_id,)))
        except sqlite3.DatabaseError as exc:
            if "database is locked" in str(exc):
                raise
    from mlflow.tracking import MlflowClient

    _point_mlflow(ws)
    return run, dict(MlflowClient().get_run(run.run_id).data.params)


@contextlib.contextmanager
def _read_only(db: Path) -> Iterator[sqlite3.Connection]:
    # Read-only: a listing never creates or migrates a store, nor waits behind a writer's lock for long.
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        yield con
    finally:
        con.close()


def _sqlite_summaries(db: Path, experiment: str) -> list[RunSummary]:
    runs_of = ("SELECT r.run_uuid FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
               "WHERE e.name = ? AND r.lifecycle_stage = 'active'")
    with _read_only(db) as con:
        rows = con.execute(
            "SELECT run_uuid, name, status, start_time, end_time FROM runs WHERE run_uuid IN "
            f"({runs_of}) ORDER BY start_time DESC", (experiment,)).fetchall()
        found = {r[0]: RunSummary(r[0], r[1] or "", r[2], r[3], r[4]) for r in rows}
        marks = ",".join("?" * len(SUMMARY_TAGS))
        for run_id, key, value in con.execute(
                f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({runs_of}) "
                f"AND (key IN ({marks}) OR key LIKE 'llmforge.out.%')", (experiment, *SUMMARY_TAGS)):
            found[run_id].tags[key] = value
        marks = ",".join("?" * len(HEADLINE_METRICS))
        for run_id, key, value in con.execute(
                f"SELECT run_uuid, key, value FROM latest_metrics WHERE run_uuid IN ({runs_of}) "
                f"AND key IN ({marks}) AND NOT is_nan", (experiment, *HEADLINE_METRICS)):
            found[run_id].metrics[key] = value
    return list(found.values())


def _point_mlflow(ws: Workspace) -> str:
    return configure(ws, experiment_name())


def _mlflow_summaries(ws: Workspace) -> list[RunSummary]:
    return [RunSummary(r["run_id"], r["name"] or "", r["status"], r["start_time"], r["end_time"],
                       {k: v for k, v in r["tags"].items() if k in SUMMARY_TAGS or k.startswith(OUT_TAG)},
                       {k: v for k, v in r["metrics"].items() if k in HEADLINE_METRICS})
            for r in workspace_runs(ws)]
