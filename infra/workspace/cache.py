"""Stage keys and recorded results: what makes a stage's folder content-addressed and movable.

A stage's key (infra/stages.stage_key) is a sha256 of its name, its code version
(infra/workspace/code_version.py) and a fingerprint of its config and every declared input: a typed
config by its values, a path produced by an earlier stage by that stage's recorded content
digest, any other path by its size and mtime. A result is recorded as JSON with every path
inside the workspace written relative to it, so a copied or moved workspace (`cp -a`, `mv`)
reuses its folders where they are now.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.workspace.code_version import code_version
from infra.workspace.paths import Workspace
from infra.workspace.record import read_record, record_root


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
    """A stage output by its record's digest (content, wherever the workspace lives); else size and mtime."""
    root = record_root(path) if path.exists() else None
    record = read_record(root) if root is not None else None
    if record is not None:
        return ["stage-output", str(Path(path).resolve().relative_to(root)), record["digest"]]
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


def content_key(kind: str, name: str, modules: list[str], config: Any, inputs: dict[str, Any]) -> str:
    """sha256 of what a stage, task or flow computes: its kind and name, its code (each of `modules` and
    every project module it reaches), its config and the fingerprints of its inputs."""
    payload = {kind: name, "code": [code_version(m) for m in sorted(set(modules))], "config": fingerprint(config),
               "inputs": {k: fingerprint(v) for k, v in sorted(inputs.items())}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def flow_key(name: str, module: str, config: Any, inputs: dict[str, Any]) -> str:
    """What a flow run computes, as a key. An MLflow run tagged with it is continued by the next attempt
    with the same key (infra/tracking/runs.py `stage_run`), so a resumed flow keeps one run."""
    return content_key("flow", name, [module], config, inputs)


REL = "./"  # how a recorded result marks a path inside the workspace


def to_workspace(data: Any, ws: Workspace) -> Any:
    """A result as JSON with every path inside the workspace written relative to it ("./tokens/...")."""
    root = str(ws.root) + "/"
    return workspace_paths(data, lambda p: REL + p[len(root):] if p.startswith(root) else p)


def from_workspace(data: Any, ws: Workspace) -> Any:
    """`to_workspace` undone against `ws`, wherever the workspace lies now."""
    return workspace_paths(data, lambda p: str(ws.root / p[len(REL):]) if p.startswith(REL) else p)


def workspace_paths(data: Any, change: Callable[[str], str]) -> Any:
    """`data` (a result as JSON) with `change` applied to every string: its paths are strings."""
    if isinstance(data, dict):
        return {k: workspace_paths(v, change) for k, v in data.items()}
    if isinstance(data, list):
        return [workspace_paths(v, change) for v in data]
    return change(data) if isinstance(data, str) else data
