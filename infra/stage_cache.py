"""Prefect caching for pipeline stages, keyed on the *content* of their inputs and their config.

Prefect's INPUTS policy hashes argument values; a `Path` argument would hash only its
name, so a changed input file would wrongly hit the cache. This policy replaces each
path by a fingerprint of what is there (size and mtime of files, recursively for
folders), and each typed config by its JSON. Cache records and results live in the
workspace, so deleting the workspace resets everything.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from pydantic import BaseModel

from infra.paths import Workspace

# Bump when a stage's output format changes, so old cache entries stop matching.
CACHE_VERSION = "1"
# Arguments that name where results go (or which MLflow run to log into) enter the key by
# name only, or not at all: they do not change what the stage computes.
OUTPUT_ARGS = ("out", "removed")
VOLATILE_ARGS = ("mlflow_run_id",)


def fingerprint(value: Any) -> Any:
    """A JSON-able stand-in for a task argument that changes when its content changes."""
    if isinstance(value, Path):
        return path_fingerprint(value)
    if isinstance(value, BaseModel):
        return {k: fingerprint(v) for k, v in value.__dict__.items()} | {"__type__": type(value).__name__}
    if isinstance(value, dict):
        return {str(k): fingerprint(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [fingerprint(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def path_fingerprint(path: Path) -> Any:
    if not path.exists():
        return [str(path), "missing"]
    if path.is_file():
        st = path.stat()
        return [str(path), st.st_size, st.st_mtime_ns]
    entries = []
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            st = p.stat()
            entries.append([str(p.relative_to(path)), st.st_size, st.st_mtime_ns])
    return [str(path), entries]


@dataclass
class ContentInputs(CachePolicy):
    """Cache key = task name + code version + fingerprints of all inputs.

    Arguments whose name starts with "out" or "removed" are output locations and
    enter the key by name only.
    """

    def compute_key(self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any):
        payload = {
            "task": task_ctx.task.name if task_ctx else None,
            "version": CACHE_VERSION,
            # Outputs are keyed by name only: their content is what the task produces.
            "inputs": {
                k: (str(v) if k.startswith(OUTPUT_ARGS) else fingerprint(v))
                for k, v in sorted(inputs.items())
                if k not in VOLATILE_ARGS
            },
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def cached(task_obj, ws: Workspace):
    """Give a Prefect task content-keyed caching with records and results inside the workspace."""
    store = ws.root / ".prefect-cache"
    store.mkdir(parents=True, exist_ok=True)
    return task_obj.with_options(
        cache_policy=ContentInputs().configure(key_storage=store / "keys"),
        persist_result=True,
        result_storage=store / "results",
    )


def run_cached(task_obj, ws: Workspace, *args: Any, outputs=lambda result: [], **kwargs: Any):
    """Run a stage through the cache; rerun it when a cached result's output files are gone."""
    result = cached(task_obj, ws)(*args, **kwargs)
    if any(not Path(p).exists() for p in outputs(result)):
        result = cached(task_obj, ws).with_options(refresh_cache=True)(*args, **kwargs)
    return result
