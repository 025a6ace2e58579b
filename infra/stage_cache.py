"""Content-addressed stage outputs, cached through Prefect.

A stage's key is a sha256 of its task name, its code version (infra/code_version.py) and
a fingerprint of every input: a typed config by its values, a path produced by an earlier
stage by that stage's recorded content digest, any other path by its size and mtime. The
stage writes into `work/<store>/<key>/` (the `OUT` placeholder in its arguments), so a
second variant of a stage never touches the first one's files, and every MLflow run
keeps pointing at its own data and model.

    near = run_cached(near_dedup_task, ws, "data/near", exact.output, OUT / "docs.parquet",
                      OUT / "removed.parquet", config.near)

After a fresh run the folder gets its completion record (infra/stage_record.py). A
Prefect cache hit is trusted only when the folder still matches its record; otherwise
the stage reruns, and says why. The active MLflow run is tagged with each output's path
(`llmforge.out.<store>`) and whether it was reused (`llmforge.cache.<store>`): what
`llmforge runs` and `llmforge gc` read.
"""
from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CacheKeyFnPolicy
from pydantic import BaseModel

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


@dataclass
class StageCall:
    """One stage call with its key worked out: the folder it writes, the arguments it gets."""

    task_obj: Any
    ws: Workspace
    store: str
    key: str
    out_dir: Path
    args: dict[str, Any]

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

    def task(self, refresh: bool = False) -> Any:
        """The Prefect task with this call's key as its cache key, results kept in the workspace."""
        cache = self.ws.root / ".prefect-cache"
        cache.mkdir(parents=True, exist_ok=True)
        key = self.key
        return self.task_obj.with_options(
            cache_policy=CacheKeyFnPolicy(cache_key_fn=lambda *_: key).configure(key_storage=cache / "keys"),
            persist_result=True,
            result_storage=cache / "results",
            refresh_cache=refresh,
        )

    def finish(self, state: Any, log: Callable[[str], Any]) -> Any:
        """Record a fresh output, or check a reused one against its record (rerunning on a mismatch)."""
        value = state.result()
        status = "miss"
        if state.name == "Cached":
            problem = verify_record(self.out_dir)
            if problem is None:
                status = "hit"
            else:
                log(f"stage {self.task_obj.name}: cached output {self.rel} failed verification ({problem}); rerunning it")
                value = self.task(refresh=True)(**self.args)
                status = "rerun"
        if status != "hit":
            self.out_dir.mkdir(parents=True, exist_ok=True)
            write_record(self.out_dir, self.key, self.task_obj.name)
        point_latest(self.ws.latest(self.store), self.out_dir)
        tag_active_run(f"llmforge.cache.{self.tag}", status)
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
    return call.finish(call.task()(**call.args, return_state=True), log), call.out_dir


def run_cached(task_obj: Any, ws: Workspace, store: str, *args: Any, **kwargs: Any) -> Any:
    """`run_into` for stages whose result names its own files: only the result."""
    return run_into(task_obj, ws, store, *args, **kwargs)[0]


class PendingStage:
    """A submitted stage; `result()` waits, then records or verifies its output like `run_cached`."""

    def __init__(self, call: StageCall, future: Any, log: Callable[[str], Any]):
        self.call, self.future, self.log = call, future, log

    def result(self) -> Any:
        self.future.wait()
        return self.call.finish(self.future.state, self.log)


def submit_cached(task_obj: Any, ws: Workspace, store: str, *args: Any, key_ignore: tuple[str, ...] = (),
                  log: Callable[[str], Any] = print, **kwargs: Any) -> PendingStage:
    """`run_cached` on the flow's task runner: stages submitted together run concurrently."""
    call = StageCall.prepare(task_obj, ws, store, args, kwargs, key_ignore)
    call.announce()
    return PendingStage(call, call.task().submit(**call.args), log)
