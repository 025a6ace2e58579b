"""Where a run came from: the git commit, the entry point, and the Prefect flow run it ran in.

The git commit (and whether the tree was dirty), the entry point, and, inside a Prefect flow run, that
flow run's id and UI link, with a Prefect artifact on the flow run linking back to the MLflow run.

The Prefect link is a convenience: when Prefect cannot be read or refuses the artifact,
the stage goes on with a warning.
"""
from __future__ import annotations

import re
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.tracking.redaction import redact

# mlflow is imported inside the functions that use it: a rank that never logs, a data worker and `llmforge --help`
# do not pay for its import.
# So is prefect: imported inside the functions that use it.

REPO_ROOT = Path(__file__).resolve().parents[2]


def git_state(root: Path | str | None = None) -> dict[str, str]:
    """`{"commit": sha, "dirty": "true"/"false"}` of the checkout at `root` (default: this
    repository); empty when it is not one or git is missing."""
    root = REPO_ROOT if root is None else root
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return {}
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    state = {"commit": head.stdout.strip()}
    if status.returncode == 0:
        state["dirty"] = "true" if status.stdout.strip() else "false"
    return state


def prefect_flow_run() -> dict[str, str]:
    """The Prefect flow run this code runs in: `id`, `flow_name` and `url` (when a UI URL is
    configured, `PREFECT_UI_URL` or derived from `PREFECT_API_URL`); empty outside a flow run."""
    try:
        from prefect.runtime import flow_run
        from prefect.utilities.urls import url_for

        run_id = flow_run.get_id()
        if not run_id:
            return {}
        found = {"id": str(run_id)}
        name = flow_run.get_flow_name()
        if name:
            found["flow_name"] = str(name)
        url = url_for("flow-run", obj_id=run_id)
        if url:
            found["url"] = url
        return found
    except Exception as exc:  # the link is a convenience; never fail a stage over it
        warnings.warn(f"could not read the Prefect flow run for MLflow tags: {exc}", stacklevel=2)
        return {}


def entry_point(flow_run: Mapping[str, str] | None = None) -> str:
    """What started this run, for `mlflow.source.name`: the Prefect flow's name inside a flow
    run, else the program (`llmforge`, or a script's path relative to the repository)."""
    flow_name = (prefect_flow_run() if flow_run is None else flow_run).get("flow_name")
    if flow_name:
        return flow_name
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    if program.name == "__main__.py":  # `python -m package`: the package says more than __main__.py
        program = program.parent
    try:
        return program.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return program.name


def origin_tags(flow_run: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tags that say where a new run came from: git commit and dirty flag (when a git
    checkout), the entry point, and the Prefect flow run id and UI URL (inside one).

    `flow_run` is what `prefect_flow_run()` returned, when the caller already asked."""
    flow_run = prefect_flow_run() if flow_run is None else flow_run
    tags = {"mlflow.source.name": entry_point(flow_run)}
    git = git_state()
    if "commit" in git:
        tags["llmforge.git_commit"] = tags["mlflow.source.git.commit"] = git["commit"]
    if "dirty" in git:
        tags["llmforge.git_dirty"] = git["dirty"]
    if "id" in flow_run:
        tags["llmforge.prefect_flow_run_id"] = flow_run["id"]
    if "url" in flow_run:
        tags["llmforge.prefect_flow_run_url"] = flow_run["url"]
    return tags


LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` (and infra/scripts/start_mlflow_server.sh) listens


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key from its parts (lowercase letters, digits and dashes, as Prefect requires).

    Built from the flow and the stage only, never the flow run, so every run of a pipeline's stage adds a
    version to one artifact, and Prefect shows its history."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-") or "llmforge"


def mlflow_ui_url(experiment_id: str, run_id: str, uri: str | None = None) -> str:
    """The run's address in the MLflow UI: on the tracking server when one is set, else the local `mlflow ui`."""
    return mlflow_run_url(experiment_id, run_id, uri) or f"{LOCAL_MLFLOW_UI}/#/experiments/{experiment_id}/runs/{run_id}"


def mlflow_run_url(experiment_id: str, run_id: str, uri: str | None = None) -> str | None:
    """The MLflow UI address of a run when the tracking URI is an http(s) server, else None."""
    import mlflow

    uri = uri or mlflow.get_tracking_uri()
    if not uri.lower().startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def link_prefect_to_run(stage: str, run: Any, flow_run: Mapping[str, str]) -> None:
    """Inside a Prefect flow run (`flow_run` not empty), attach an artifact that links to the MLflow run."""
    if not flow_run:
        return
    import mlflow

    exp_id, run_id = run.info.experiment_id, run.info.run_id
    # One key per flow and stage, so the artifact keeps a version per run (Prefect's history of it).
    key = artifact_key(flow_run.get("flow_name", "llmforge"), "mlflow", stage)
    description = f"MLflow run of stage {stage}"
    url = mlflow_run_url(exp_id, run_id)
    try:
        from prefect.artifacts import create_link_artifact, create_markdown_artifact

        if url:
            create_link_artifact(link=url, link_text=f"MLflow run {run_id}", key=key, description=description)
        else:
            store = redact("uri", mlflow.get_tracking_uri())
            create_markdown_artifact(
                key=key,
                description=description,
                markdown=(
                    f"[MLflow run {run_id}]({mlflow_ui_url(exp_id, run_id)}) (stage {stage}), in a local store: "
                    f"the link opens once the MLflow UI runs:\n\n"
                    f"    mlflow ui --backend-store-uri {store}\n"
                ),
            )
    except Exception as exc:  # the link is a convenience; never fail a stage over it
        warnings.warn(f"could not create the Prefect artifact linking MLflow run {run_id}: {exc}", stacklevel=2)
