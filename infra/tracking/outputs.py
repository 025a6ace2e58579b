"""What a workspace holds: its output folders, the runs that refer to them, and garbage collection.

Its stage output folders, the MLflow runs that refer to them, and garbage collection of the folders
nothing refers to.

Every stage tags the MLflow run it ran under with its output folder
(`llmforge.out.<store>.<key>` = `data/near/<key>`, infra/workspace/cache.py), so a folder is
in use while a run (of any status, not deleted) or a registered model version's run
names it. `llmforge gc` removes the folders no run refers to (a dry run unless told to
apply); `llmforge runs` (flows/runs_view.py) lists the runs with their folders.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.tracking.store import configure, workspace_runs
from infra.workspace.paths import Workspace

# mlflow is imported inside the functions that use it: a rank that never logs, a data worker and `llmforge --help`
# do not pay for its import.

OUT_TAG = "llmforge.out."


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def output_folders(ws: Workspace) -> list[Path]:
    """Every stage output folder in the workspace (the `latest` links and staging folders left out)."""
    found = []
    for store in ws.STORES:
        folder = ws.root / store
        if folder.is_dir():  # a store inside another (eval/items inside eval) is no output folder of the outer one
            found += sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                            and f"{store}/{p.name}" not in ws.STORES)
    return found


def run_outputs(run: dict[str, Any]) -> list[str]:
    """The output folders (relative to the workspace) a run's tags name."""
    return sorted(v for k, v in run["tags"].items() if k.startswith(OUT_TAG))


def registered_version_refs(ws: Workspace) -> list[dict[str, Any]]:
    """Every registered model version of the workspace's store: name, version, run id, tags."""
    from mlflow.tracking import MlflowClient

    configure(ws)
    return [
        {"name": v.name, "version": v.version, "run_id": v.run_id, "tags": dict(v.tags or {})}
        for v in MlflowClient().search_model_versions(max_results=10_000)
    ]


def referenced(ws: Workspace, runs: list[dict[str, Any]]) -> set[str]:
    """Folders named by any run, or by any path-valued tag of a registered model version."""
    refs = {out for run in runs for out in run_outputs(run)}
    for version in registered_version_refs(ws):
        for value in version["tags"].values():
            path = Path(str(value))
            if path.is_absolute() and path.is_relative_to(ws.root):
                refs.add(str(path.relative_to(ws.root)))
    # A path to a file inside a folder (a manifest, a model dir) keeps the folder: its store's path and one part more.
    return {folder for r in refs if (folder := output_folder_of(ws, r)) is not None}


def output_folder_of(ws: Workspace, rel: str) -> str | None:
    """The output folder (relative) that holds the workspace path `rel`: the deepest store it lies in, one part on."""
    parts = Path(rel).parts
    for n in range(len(parts) - 1, 0, -1):
        if "/".join(parts[:n]) in ws.STORES:
            return "/".join(parts[:n + 1])
    return None


@dataclass
class GcPlan:
    remove: list[Path]
    keep: int
    bytes: int


def plan_gc(ws: Workspace) -> GcPlan:
    """The output folders no MLflow run or registered model refers to, with the bytes they hold."""
    refs = referenced(ws, workspace_runs(ws))
    folders = output_folders(ws)
    remove = [f for f in folders if str(f.relative_to(ws.root)) not in refs]
    return GcPlan(remove=remove, keep=len(folders) - len(remove), bytes=sum(folder_bytes(f) for f in remove))


def apply_gc(ws: Workspace, plan: GcPlan) -> None:
    """Remove the planned folders and the `latest` links left pointing at nothing (the caller
    holds the workspace lock: no run is writing)."""
    for folder in plan.remove:
        shutil.rmtree(folder)
    for store in ws.STORES:
        link = ws.latest(store)
        if link.is_symlink() and not link.exists():
            link.unlink()
