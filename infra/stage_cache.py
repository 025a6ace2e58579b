"""Prefect caching for pipeline stages, keyed on the *content* of their inputs, their config
and their code.

Prefect's INPUTS policy hashes argument values; a `Path` argument would hash only its
name, so a changed input file would wrongly hit the cache. This policy replaces each
path by a fingerprint of what is there (size and mtime of files, recursively for
folders), and each typed config by its JSON. The code enters the key as the hash of the
source of the task's module and of every project module it imports (and of the worker
module a training stage launches), so an edited stage reruns, and a moved module, whose
pickled results name the old path, never hits a stale record. Cache records and
results live in the workspace, so deleting the workspace resets everything.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from pydantic import BaseModel

from infra.paths import Workspace

# Packages whose source is the project's code (what a stage's code version covers).
PROJECT_PACKAGES = ("tasks", "models", "infra", "flows")
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
            "code": code_version(task_ctx.task.fn.__module__) if task_ctx else None,
            # Outputs are keyed by name only: their content is what the task produces.
            "inputs": {
                k: (str(v) if k.startswith(OUTPUT_ARGS) else fingerprint(v))
                for k, v in sorted(inputs.items())
                if k not in VOLATILE_ARGS
            },
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _project_imports(name: str, source: str, packages: tuple[str, ...]) -> set[str]:
    """Project modules that `name`'s source imports (at any depth in the file, lazy imports included)."""
    found: set[str] = set()
    package = name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            # `from tasks.data import builtin_corpus` imports a module, not a name.
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "WORKER_MODULE" for t in node.targets):
            # A training stage launches its worker by module name: that code is the stage's too.
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                found.add(node.value.value)
    return {m for m in found if m.split(".")[0] in packages and _module_file(m) is not None}


@functools.lru_cache(maxsize=None)
def code_version(module: str, packages: tuple[str, ...] = PROJECT_PACKAGES) -> str:
    """sha256 over the module's name and source and those of every project module it reaches."""
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        source = path.read_text(encoding="utf-8")
        seen[name] = hashlib.sha256(source.encode("utf-8")).hexdigest()
        todo.extend(_project_imports(name, source, packages) - seen.keys())
    return hashlib.sha256(json.dumps(sorted(seen.items())).encode()).hexdigest()


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
