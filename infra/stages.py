"""A stage is one object; one runner gives it its folder, cache check, Prefect task, MLflow run and launch.

    class ExactDedup(Stage):                              # tasks/data/exact_dedup.py: runs in this process
        name, store = "exact_dedup", "data/exact"
        Config, Result = ExactDedupConfig, StageResult
        inputs = ("docs",)                                # what the cache key covers, besides config and code
        def compute(self, inputs, out_dir) -> StageResult

    class Pretrain(LaunchedStage):                        # tasks/training/pretrain/stage.py: runs on DeepSpeed ranks
        name, store = "pretrain", "checkpoints/pretrain"
        Config, Result = PretrainConfig, PretrainResult
        inputs = ("tokens", "tokenizer")
        def prepare(self, inputs, out_dir) -> Launch      # stage side: check the inputs, say what the ranks read
        ...                                               # rank side: model, steps, finish (its rank_module's main)

    exact = run(ExactDedup(config.exact), ws, docs=collected.output)
    base = run(Pretrain(config.pretrain), ws, tokens=tokens_dir, tokenizer=tokenizer_json)

The key of a stage's folder is a sha256 of its name, its code (its module and every project
module it reaches, infra/workspace/code_version.py), its config and the content of each declared input
(a stage output by its record's digest, infra/workspace/cache.py `fingerprint`): nothing else, so a
renamed parameter changes no key. A folder is reused only when it matches its record
(infra/workspace/record.py) and holds the stage's result.json, read back as JSON with its paths
relative to the workspace: no pickle is ever loaded, and a copied or moved workspace reruns
nothing. The record also names the paths the folder was made from (`recorded_inputs`: the
tokens' manifest, which a pretraining run logs as its dataset input). An in-process stage runs
as a Prefect task inside the caller's MLflow run (`submit` puts it on the flow's task runner: Ray
for the data stages on a cluster). A launched stage gets its own MLflow run; its ranks read
out_dir/job.json and train with out_dir/ds_config.json exactly as written; a rerun into a folder
with checkpoints resumes them, refused when the settings that change what is trained differ.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, TypeAdapter

from infra.config import StrictModel, flatten_params
from infra.launch.launcher import launch
from infra.lifecycle.memory import release_freed_memory
from infra.tracking.runs import stage_run, tag_active_run
from infra.workspace.atomic import write_json_atomic
from infra.workspace.cache import content_key, from_workspace, to_workspace
from infra.workspace.paths import Workspace, point_latest
from infra.workspace.record import read_record, verify_record, write_record

# prefect is imported inside the functions that use it: a rank, `llmforge --help` and the CLI's quick errors do not
# pay for its import.

JOB_FILE = "job.json"  # what a launched stage's ranks read
RESULT_FILE = "result.json"  # the stage's result, its paths relative to the workspace; written before the record
DS_CONFIG_FILE = "ds_config.json"  # the DeepSpeed config the ranks train with, as written
CHECKPOINTS_DIR = "checkpoints"
LAUNCH_LOG = "launch.log"  # every line of the stage's launches, DeepSpeed's INFO lines included
RUN_STARTED = "llmforge: run started:"  # what rank 0 prints, then out_dir, before each job of a queue
RUN_DONE = "llmforge: run finished:"  # what rank 0 prints, then out_dir, after each job of a launch
QUEUE_FILE = "queue.json"  # a run queue's job.json paths, which its launches claim one at a time
INPUTS_KEY = "inputs"  # in a folder's record: the paths it was made from (`recorded_inputs`)


class Stage:
    """One stage: its config, its declared inputs, its output store and result type.

    An in-process stage implements `compute(inputs, out_dir)`; a launched one is a LaunchedStage.
    """

    name: ClassVar[str]  # the Prefect task's (and a launched stage's MLflow stage) name
    store: ClassVar[str]  # infra.workspace.paths.Workspace.STORES entry of its folders
    Config: ClassVar[Any]
    Result: ClassVar[Any]  # a pydantic model or any type pydantic validates (a Path)
    inputs: ClassVar[tuple[str, ...]] = ()  # names of what it reads besides its config: upstream paths, results, values
    task_options: ClassVar[dict[str, Any]] = {}  # Prefect task options of an in-process stage (retries, ...)
    # Its Prefect task runs' name, a template over `compute`'s arguments: "collect-{stage.config.name}".
    run_name: ClassVar[str | None] = None

    def __init__(self, config: Any = None) -> None:
        self.config = config

    @classmethod
    def path(cls) -> str:
        """`module:Class`, how a job names the stage for the ranks."""
        return f"{cls.__module__}:{cls.__qualname__}"

    def compute(self, inputs: dict[str, Any], out_dir: Path) -> Any:
        """In-process stages: do the work into out_dir; the result."""
        raise NotImplementedError

    def after(self, result: BaseModel, inputs: dict[str, Any]) -> BaseModel:
        """Launched stages, stage side, after a fresh run inside its MLflow run: measure and log what the ranks
        could not (pretraining's baseline); the result to record."""
        return result


class Job(StrictModel):
    """out_dir/job.json: what every rank of a launched stage reads."""

    stage: str  # Stage.path()
    config: dict[str, Any]
    inputs: dict[str, Path | None]  # the inputs that are paths (absolute)
    values: dict[str, Any] = {}  # the other inputs, as JSON (a config section several stages read, as a dict)
    extra: dict[str, Any] = {}  # what the stage side resolved for the ranks (e.g. the model architecture)
    out_dir: Path
    ws_root: Path
    mlflow_run_id: str | None
    precision: Literal["fp32", "bf16"]  # what `launch.precision` resolved to on the launching machine, and why
    precision_reason: str


@dataclass
class Launch:
    """What a launched stage's `prepare` hands the runner."""

    ds_config: dict[str, Any]
    precision: Literal["fp32", "bf16"]
    precision_reason: str
    extra: dict[str, Any] = field(default_factory=dict)  # into the job
    identity: dict[str, Any] = field(default_factory=dict)  # beside the config in the config file: must match on resume


class LaunchedStage(Stage):
    """A stage whose work runs on DeepSpeed ranks, started by DeepSpeed's launcher.

    Stage side: `prepare` checks the inputs and says what the ranks read. Rank side (the stage's `rank_module`
    `main`, on every rank): `for_job` rebuilds the stage from job.json, then `model()`, `steps(rank, world)`
    (the loop's Steps), `shape()` (micro_batch_size, grad_accum, seq_len) and, after training,
    `finish(trained, mlflow_run, rank, world)`, whose rank 0 writes result.json.
    """

    # Config keys (dotted, or a whole component) that may differ between a run and its resume.
    resume_neutral: ClassVar[frozenset[str]] = frozenset()
    # The module every rank runs (`deepspeed --module <rank_module> --job job.json`): it rebuilds the stage with
    # `for_job`. Part of the stage's cache key, as its own module is.
    rank_module: ClassVar[str]
    job: Job

    @classmethod
    def for_job(cls, job: Job) -> "LaunchedStage":
        """The stage a rank runs: its config validated again from job.json, the job attached."""
        stage = cls(cls.Config.model_validate(job.config))
        stage.job = job
        return stage

    config_file: ClassVar[str]  # out_dir/<name>_config.json: the resolved config, compared on a resume

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            cls.config_file = f"{cls.name}_config.json"

    def prepare(self, inputs: dict[str, Any], out_dir: Path) -> Launch:
        raise NotImplementedError


def stage_key(stage: Stage, inputs: dict[str, Any]) -> str:
    """sha256 of the stage's name, code (with the ranks' entry point for a launched one), config and inputs."""
    modules = [type(stage).__module__] + ([stage.rank_module] if isinstance(stage, LaunchedStage) else [])
    return content_key("stage", stage.name, modules, stage.config, inputs)


def run(stage: Stage, ws: Workspace, **inputs: Any) -> Any:
    """The stage's result: reused from its verified folder, or computed there (a launched stage on its ranks)."""
    return place(stage, ws, **inputs).run()


def submit(stage: Stage, ws: Workspace, **inputs: Any) -> "Pending":
    """`run` on the flow's task runner (stages submitted together run concurrently); `.result()` waits."""
    return place(stage, ws, **inputs).submit()


def place(stage: Stage, ws: Workspace, **inputs: Any) -> "Placed":
    """The stage with its key worked out: its folder (named in the active MLflow run before any work)."""
    if sorted(inputs) != sorted(stage.inputs):
        raise TypeError(f"stage {stage.name} declares inputs {sorted(stage.inputs)}, got {sorted(inputs)}")
    key = stage_key(stage, inputs)
    placed = Placed(stage, ws, inputs, key, ws.output(stage.store, key))
    tag_active_run(f"llmforge.out.{placed.tag}", placed.rel)
    return placed


@dataclass
class Placed:
    """One stage call: the stage, its workspace, its inputs, its key and folder."""

    stage: Stage
    ws: Workspace
    inputs: dict[str, Any]
    key: str
    out_dir: Path
    damaged: bool = False  # its folder failed verification: it reruns ("rerun" in the MLflow tag)

    @property
    def rel(self) -> str:
        return str(self.out_dir.relative_to(self.ws.root))

    @property
    def tag(self) -> str:
        # One tag per folder: a run can hold several of one store (collect per source, eval per model).
        return f"{self.stage.store.replace('/', '.')}.{self.out_dir.name}"

    def run(self) -> Any:
        done = self.reused()
        if done is not None:
            return done
        if isinstance(self.stage, LaunchedStage):
            return self.finish(self._launched())
        return self.finish(self._task()(self.stage, self.inputs, self.out_dir))

    def submit(self) -> "Pending":
        task = self._task()
        # A launched stage's work is on its ranks already, and outside a flow run there is no task runner:
        # either way it runs here.
        if isinstance(self.stage, LaunchedStage) or not hasattr(task, "submit"):
            return Pending(self, None, self.run())
        done = self.reused()
        if done is not None:
            return Pending(self, None, done)
        return Pending(self, task.submit(self.stage, self.inputs, self.out_dir), None)

    def reused(self) -> Any | None:
        """The result of a complete, verified earlier run of this key (a line says so); None otherwise."""
        if read_record(self.out_dir) is None or not (self.out_dir / RESULT_FILE).is_file():
            return None
        problem = verify_record(self.out_dir)
        if problem is not None:
            print(f"stage {self.stage.name}: output {self.rel} failed verification ({problem}); rerunning it")
            self.damaged = True
            return None
        data = json.loads((self.out_dir / RESULT_FILE).read_text(encoding="utf-8"))
        result = TypeAdapter(self.stage.Result).validate_python(from_workspace(data, self.ws))
        print(f"stage {self.stage.name}: reused {self.rel} (verified against its record)")
        self._close("hit")
        return result

    def finish(self, result: Any) -> Any:
        """Record a fresh result (result.json, then the record over every file); tag the run; point `latest`."""
        data = to_workspace(TypeAdapter(self.stage.Result).dump_python(result, mode="json"), self.ws)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out_dir / RESULT_FILE, data)
        lineage = {INPUTS_KEY: input_paths(self.inputs, self.ws, self.out_dir)}
        write_record(self.out_dir, self.key, self.stage.name, lineage)
        self._close("rerun" if self.damaged else "miss")
        release_freed_memory()  # the next stage starts from what this one freed, not from its peak
        return result

    def begin(self) -> Path:
        """A launched stage's run, made ready for a launch that trains it later with others (infra/run_queue.py):
        its MLflow run opened and left SCHEDULED (its rank 0 continues it), `prepare` checked, job.json written;
        the job's path."""
        stage = self.stage
        with stage_run(self.ws, stage.name, stage.config, run_key=self.key, tags={f"llmforge.out.{self.tag}": self.rel},
                       config_key=stage.name, status="SCHEDULED") as mlflow_run:
            spec = stage.prepare(self.inputs, self.out_dir)  # a bad input fails here, before any launch
            return write_launch(stage, spec, self.inputs, self.out_dir, self.ws, mlflow_run.info.run_id)

    def end(self) -> Any:
        """After its ranks wrote result.json: `after` in the run's MLflow run, then the result recorded like `run`'s."""
        job = Job.model_validate_json((self.out_dir / JOB_FILE).read_text(encoding="utf-8"))
        ranks_wrote = read_result(self.stage, self.out_dir, self.ws)
        with stage_run(self.ws, self.stage.name, run_id=job.mlflow_run_id):
            result = self.stage.after(ranks_wrote, self.inputs)
        return self.finish(result)

    def trained_unrecorded(self) -> bool:
        """Its ranks finished (result.json, written last by rank 0) but the stage side never recorded it: a flow
        stopped between the two. The folder is this key's, so `end` completes it without training again."""
        return (read_record(self.out_dir) is None and (self.out_dir / RESULT_FILE).is_file()
                and (self.out_dir / JOB_FILE).is_file())

    def _close(self, cache: str) -> None:
        tag_active_run(f"llmforge.cache.{self.tag}", cache)
        point_latest(self.ws.latest(self.stage.store), self.out_dir)

    def _task(self) -> Any:
        """`compute` as a Prefect task inside a flow run (else the plain function); reuse is decided here,
        so Prefect neither caches nor persists results."""
        from prefect.cache_policies import NO_CACHE

        return prefect_task(compute, self.stage.name, task_run_name=self.stage.run_name or self.stage.name,
                            cache_policy=NO_CACHE, persist_result=False, **self.stage.task_options)

    def _launched(self) -> Any:
        """A launched stage's fresh run, in its own MLflow run: the launcher as the Prefect task."""
        stage = self.stage
        with stage_run(self.ws, stage.name, stage.config, run_key=self.key,
                       tags={f"llmforge.out.{self.tag}": self.rel}, config_key=stage.name) as mlflow_run:
            spec = stage.prepare(self.inputs, self.out_dir)  # a bad input fails here, before the ranks exist
            job = write_launch(stage, spec, self.inputs, self.out_dir, self.ws, mlflow_run.info.run_id)
            launched = prefect_task(launch, f"{stage.name}-launch")
            launched(stage.rank_module, ["--job", str(job)], **launch_settings(stage.config), log=task_log,
                     log_file=self.out_dir / LAUNCH_LOG)
            return stage.after(read_result(stage, self.out_dir), self.inputs)


def input_paths(inputs: dict[str, Any], ws: Workspace, out_dir: Path) -> dict[str, str]:
    """The inputs that are paths, as a folder's record names them: one inside the workspace relative to `out_dir`
    (a copied or moved workspace moves with it), any other absolute."""
    root, here, paths = ws.root.resolve(), out_dir.resolve(), {}
    for name, value in inputs.items():
        if isinstance(value, Path):
            path = value.resolve()
            paths[name] = os.path.relpath(path, here) if path.is_relative_to(root) else str(path)
    return paths


def recorded_inputs(out_dir: Path) -> dict[str, Path]:
    """The paths a stage's folder was made from (input name -> path), as its record names them; empty for a folder
    recorded without them."""
    named = (read_record(out_dir) or {}).get(INPUTS_KEY, {})
    return {name: Path(os.path.normpath(Path(out_dir) / path)) for name, path in named.items()}


def compute(stage: Stage, inputs: dict[str, Any], out_dir: Path) -> Any:
    """What an in-process stage's Prefect task runs (a module function, so a Ray worker can unpickle it)."""
    return stage.compute(inputs, out_dir)


@dataclass
class Pending:
    """A submitted stage (or one reused from its folder); `result()` waits, then records it like `run`."""

    placed: Placed
    future: Any
    done: Any

    def result(self) -> Any:
        return self.done if self.future is None else self.placed.finish(self.future.result())


def write_launch(stage: LaunchedStage, spec: Launch, inputs: dict[str, Any], out_dir: Path, ws: Workspace,
                 mlflow_run_id: str | None) -> Path:
    """Check a resume, then write the config file, ds_config.json and job.json; the job's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = {stage.name: stage.config.model_dump(mode="json"), **spec.identity}
    check_resume_compatible(stage, out_dir, resolved)
    write_json_atomic(out_dir / stage.config_file, resolved)
    write_json_atomic(out_dir / DS_CONFIG_FILE, spec.ds_config)
    (out_dir / RESULT_FILE).unlink(missing_ok=True)  # a stale result must never pass for this run's
    paths = {k: v for k, v in inputs.items() if v is None or isinstance(v, (str, Path))}
    values = {k: TypeAdapter(Any).dump_python(v, mode="json") for k, v in inputs.items() if k not in paths}
    job = Job(stage=stage.path(), config=stage.config.model_dump(mode="json"),
              inputs={k: Path(v).resolve() if v is not None else None for k, v in paths.items()}, values=values,
              extra=spec.extra, out_dir=out_dir.resolve(), ws_root=ws.root, mlflow_run_id=mlflow_run_id,
              precision=spec.precision, precision_reason=spec.precision_reason)
    return write_json_atomic(out_dir / JOB_FILE, job).resolve()


def check_resume_compatible(stage: LaunchedStage, out_dir: Path, resolved: dict[str, Any]) -> None:
    """Refuse to resume out_dir's checkpoints with settings that change what is trained."""
    old_path = out_dir / stage.config_file
    if not old_path.is_file() or not (out_dir / CHECKPOINTS_DIR / "latest").is_file():
        return
    old = flatten_params(json.loads(old_path.read_text(encoding="utf-8")))
    new = flatten_params(resolved)
    neutral = {f"{stage.name}.{n}" for n in stage.resume_neutral}
    changed = sorted(k.removeprefix(f"{stage.name}.") for k in set(old) | set(new)
                     if not any(k == n or k.startswith(n + ".") for n in neutral) and old.get(k) != new.get(k))
    if changed:
        raise ValueError(f"{out_dir} holds checkpoints of a run with different settings ({', '.join(changed)}); "
                         "use a new out_dir, or delete its checkpoints/ folder to start over")


def launch_settings(config: Any) -> dict[str, Any]:
    """The launcher's arguments from a stage's `launch` component."""
    launch_cfg = config.launch
    return {"num_procs": launch_cfg.num_procs, "hostfile": launch_cfg.hostfile,
            "launcher_args": launch_cfg.launcher_args, "timeout_s": launch_cfg.rank_timeout_s}


def prefect_task(fn: Any, name: str, **options: Any) -> Any:
    """`fn` as a Prefect task named `name` (with Prefect's task `options`) inside a flow run (its log streams
    into the UI), else `fn` itself."""
    from prefect import task
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return fn
    return task(fn, **{"name": name, "task_run_name": name, "cache_policy": None, **options})


def task_log(line: str) -> None:
    """A launcher line into the Prefect task's log (stdout outside one)."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        get_run_logger().info(line)
    except MissingContextError:
        print(line, flush=True)


def in_run(stage: LaunchedStage, ws: Workspace, out_dir: Path, *, log: Any = print, **inputs: Any) -> Any:
    """Launch `stage` into `out_dir` with no cache or folder key (tests, resumes into a chosen folder),
    inside its own MLflow stage run; the result its rank 0 wrote."""
    out_dir = Path(out_dir)
    with stage_run(ws, stage.name, stage.config, config_key=stage.name) as mlflow_run:
        job = write_launch(stage, stage.prepare(inputs, out_dir), inputs, out_dir, ws, mlflow_run.info.run_id)
        launch(stage.rank_module, ["--job", str(job)], **launch_settings(stage.config), log=log)
        return read_result(stage, out_dir)


def read_result(stage: Stage, out_dir: Path, ws: Workspace | None = None) -> Any:
    """The result.json the ranks' rank 0 wrote last (with `ws`, also one `finish` rewrote relative to it)."""
    path = out_dir / RESULT_FILE
    if not path.is_file():
        raise RuntimeError(f"the {stage.name} ranks exited cleanly but wrote no {path}; see the log above")
    data = json.loads(path.read_text(encoding="utf-8"))
    return stage.Result.model_validate(from_workspace(data, ws) if ws is not None else data)

