"""Content-addressed stage outputs, and their reuse.

A stage's key is a sha256 of its task name, its code version (infra/code_version.py) and
a fingerprint of every input: a typed config by its values, a path produced by an earlier
stage by that stage's recorded content digest, any other path by its size and mtime. The
stage writes into `work/<store>/<key>/` (the `OUT` placeholder in its arguments), so a
second variant of a stage never touches the first one's files, and every MLflow run
keeps pointing at its own data and model.

    near = run_cached(near_dedup_task, ws, "data/near", exact.output, OUT / "docs.parquet",
                      OUT / "removed.parquet", config.near)

After a fresh run the folder gets its completion record (infra/stage_record.py), which also
holds the task's return value as JSON, its paths relative to the workspace. A rerun reuses the
folder only when it still matches its record, and reads the result back from that JSON: no
pickle is ever loaded, and a copied or moved workspace (`cp -a`, `mv`) reruns nothing. A
folder that fails verification is rerun, with a line naming the file. The active MLflow run is tagged with each output's path
(`llmforge.out.<store>`) and whether it was reused (`llmforge.cache.<store>`): what
`llmforge runs` and `llmforge gc` read.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from infra.code_version import code_version
from infra.memory import release_freed_memory
from infra.paths import Workspace, point_latest
from infra.stage_record import read_record, record_root, verify_record, write_record
from infra.tracking import tag_active_run


@dataclass(frozen=True)
class OutputPath:
    """A path inside the stage's own output folder, filled in once the key is known."""

    parts: tuple[str, ...] = ()

    def __truediv__(self, name: str) -> "OutputPath":
        return OutputPath((*self.parts, name))

    def under(self, folder: Path) -> Path:
        return folder.joinpath(*self.parts)


OUT = OutputPath()


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
    with the same key (infra/tracking.stage_run), so a resumed flow keeps one run."""
    return content_key("flow", name, [module], config, inputs)


RESULT_KEY = "result"  # in the completion record: the task's return value as JSON
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


@dataclass
class StageCall:
    """One stage call with its key worked out: the folder it writes, the arguments it gets."""

    task_obj: Any
    ws: Workspace
    store: str
    key: str
    out_dir: Path
    args: dict[str, Any]
    damaged: bool = False  # its folder failed verification: the stage reruns ("rerun" in the MLflow tag)

    @classmethod
    def prepare(cls, task_obj: Any, ws: Workspace, store: str, args: tuple, kwargs: dict,
                key_ignore: tuple[str, ...] = ()) -> "StageCall":
        bound = inspect.signature(task_obj.fn).bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = {k: v for k, v in bound.arguments.items() if not isinstance(v, OutputPath) and k not in key_ignore}
        key = content_key("task", task_obj.name, [task_obj.fn.__module__], None, inputs)
        out_dir = ws.output(store, key)
        filled = {k: v.under(out_dir) if isinstance(v, OutputPath) else v for k, v in bound.arguments.items()}
        return cls(task_obj, ws, store, key, out_dir, filled)

    def task(self) -> Any:
        """The Prefect task; reuse is decided here (`reused`), so Prefect neither caches nor persists results."""
        from prefect.cache_policies import NO_CACHE

        return self.task_obj.with_options(cache_policy=NO_CACHE, persist_result=False)

    @property
    def result_type(self) -> Any:
        return typing.get_type_hints(self.task_obj.fn).get("return", Any)

    def reused(self, log: Callable[[str], Any]) -> tuple[bool, Any]:
        """(True, the recorded result) when the folder is complete and verifies; else (False, None)."""
        record = read_record(self.out_dir)
        if record is None or RESULT_KEY not in record:
            return False, None
        problem = verify_record(self.out_dir)
        if problem is not None:
            log(f"stage {self.task_obj.name}: output {self.rel} failed verification ({problem}); rerunning it")
            self.damaged = True
            return False, None
        return True, TypeAdapter(self.result_type).validate_python(from_workspace(record[RESULT_KEY], self.ws))

    def finish(self, value: Any, reused: bool) -> Any:
        """Record a fresh output with its result (workspace-relative paths); tag the run; point `latest`."""
        if not reused:
            data = to_workspace(TypeAdapter(self.result_type).dump_python(value, mode="json"), self.ws)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            write_record(self.out_dir, self.key, self.task_obj.name, extra={RESULT_KEY: data})
        point_latest(self.ws.latest(self.store), self.out_dir)
        tag_active_run(f"llmforge.cache.{self.tag}", "hit" if reused else "rerun" if self.damaged else "miss")
        release_freed_memory()  # the next stage starts from what this one freed, not from its peak
        return value

    @property
    def rel(self) -> str:
        return str(self.out_dir.relative_to(self.ws.root))

    @property
    def tag(self) -> str:
        # One tag per output folder: a run can hold several of one store (collect per source, eval per model).
        return f"{self.store.replace('/', '.')}.{self.out_dir.name}"

    def announce(self) -> None:
        """Tag the active MLflow run with the output folder before the stage runs, so a failed run names it too."""
        tag_active_run(f"llmforge.out.{self.tag}", self.rel)


def run_into(task_obj: Any, ws: Workspace, store: str, *args: Any, key_ignore: tuple[str, ...] = (),
             log: Callable[[str], Any] = print, **kwargs: Any) -> tuple[Any, Path]:
    """Run a stage into its content-addressed folder in `store`, reusing a verified earlier output;
    returns (the task's result, the folder)."""
    call = StageCall.prepare(task_obj, ws, store, args, kwargs, key_ignore)
    call.announce()
    reused, value = call.reused(log)
    if reused:
        log(f"stage {task_obj.name}: reused {call.rel} (verified against its record)")
    else:
        value = call.task()(**call.args)
    return call.finish(value, reused), call.out_dir


def run_cached(task_obj: Any, ws: Workspace, store: str, *args: Any, **kwargs: Any) -> Any:
    """`run_into` for stages whose result names its own files: only the result."""
    return run_into(task_obj, ws, store, *args, **kwargs)[0]


class PendingStage:
    """A submitted stage (or one reused from its folder); `result()` waits, then records it like `run_cached`."""

    def __init__(self, call: StageCall, future: Any, reused: tuple[bool, Any]):
        self.call, self.future, self.reused = call, future, reused

    def result(self) -> Any:
        if self.reused[0]:
            return self.call.finish(self.reused[1], True)
        return self.call.finish(self.future.result(), False)


def submit_cached(task_obj: Any, ws: Workspace, store: str, *args: Any, key_ignore: tuple[str, ...] = (),
                  log: Callable[[str], Any] = print, **kwargs: Any) -> PendingStage:
    """`run_cached` on the flow's task runner: stages submitted together run concurrently."""
    call = StageCall.prepare(task_obj, ws, store, args, kwargs, key_ignore)
    call.announce()
    reused = call.reused(log)
    if reused[0]:
        log(f"stage {task_obj.name}: reused {call.rel} (verified against its record)")
        return PendingStage(call, None, reused)
    return PendingStage(call, call.task().submit(**call.args), reused)
