"""A stage is one object; one runner gives it its folder, cache check, MLflow run, Prefect task and launch.

    class Pretrain(LaunchedStage):                        # tasks/training/pretrain/stage.py
        name, store = "pretrain", "checkpoints/pretrain"
        Config, Result = PretrainConfig, PretrainResult
        inputs = ("tokens", "tokenizer")                  # what the cache key covers, besides config and code
        def prepare(self, inputs, out_dir) -> Launch      # stage side: check the inputs, say what the ranks read
        ...                                               # rank side: model, steps, result (tasks/training/loop.py)

    base = run(Pretrain(config.pretrain), ws, tokens=tokens_dir, tokenizer=tokenizer_json)

The key of a stage's folder is a sha256 of its name, its code (its module and every project
module it reaches, infra/code_version.py), its config and the content of each declared input
(a stage output by its record's digest, infra/stage_cache.fingerprint): nothing else, so a
renamed parameter changes no key. A folder is reused only when it matches its record
(infra/stage_record.py) and holds the stage's result.json, read back as JSON with its paths
relative to the workspace: no pickle is ever loaded, and a copied or moved workspace reruns
nothing. A launched stage's ranks read out_dir/job.json and train with out_dir/ds_config.json
exactly as written; a rerun into a folder with checkpoints resumes them, refused when the
settings that change what is trained differ.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from infra.atomic import write_json_atomic
from infra.config import StrictModel, flatten_params
from infra.deepspeed_launch import launch
from infra.memory import release_freed_memory
from infra.paths import Workspace, point_latest
from infra.stage_cache import content_key, from_workspace, to_workspace
from infra.stage_record import verify_record, write_record
from infra.tracking import stage_run, tag_active_run

JOB_FILE = "job.json"  # what a launched stage's ranks read
RESULT_FILE = "result.json"  # what its rank 0 writes last; the runner rewrites it with workspace-relative paths
DS_CONFIG_FILE = "ds_config.json"  # the DeepSpeed config the ranks train with, as written
CHECKPOINTS_DIR = "checkpoints"
LAUNCH_LOG = "launch.log"  # every line of the stage's launches, DeepSpeed's INFO lines included
RANK_MODULE = "tasks.training.loop"  # `deepspeed --module` of every launched stage: the one training loop


class Stage:
    """One stage: its config, its declared inputs, its output store and result type."""

    name: ClassVar[str]  # the MLflow stage and the Prefect task's name
    store: ClassVar[str]  # infra.paths.Workspace.STORES entry of its folders
    Config: ClassVar[type[BaseModel]]
    Result: ClassVar[type[BaseModel]]
    inputs: ClassVar[tuple[str, ...]] = ()  # names of the upstream paths it reads; None allowed for optional ones

    def __init__(self, config: BaseModel) -> None:
        self.config = config

    @classmethod
    def path(cls) -> str:
        """`module:Class`, how a job names the stage for the ranks."""
        return f"{cls.__module__}:{cls.__qualname__}"

    def after(self, result: BaseModel, inputs: dict[str, Path | None], reports: Path) -> BaseModel:
        """Stage side, after a fresh run, inside its MLflow run: log a report; the result to record."""
        return result


class Job(StrictModel):
    """out_dir/job.json: what every rank of a launched stage reads."""

    stage: str  # Stage.path()
    config: dict[str, Any]
    inputs: dict[str, Path | None]
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

    Stage side: `prepare` checks the inputs and says what the ranks read. Rank side (tasks/training/loop.py
    `main`, on every rank): `for_job` rebuilds the stage from job.json, then `model()`, `steps(rank, world)`
    (the loop's Steps), `shape()` (micro_batch_size, grad_accum, seq_len) and, after training,
    `finish(trained, mlflow_run, rank, world)`, whose rank 0 writes result.json.
    """

    # Config keys (dotted, or a whole component) that may differ between a run and its resume.
    resume_neutral: ClassVar[frozenset[str]] = frozenset()
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

    def prepare(self, inputs: dict[str, Path | None], out_dir: Path) -> Launch:
        raise NotImplementedError


def stage_key(stage: Stage, inputs: dict[str, Any]) -> str:
    """sha256 of the stage's name, code (with the ranks' entry point for a launched one), config and inputs."""
    modules = [type(stage).__module__] + ([RANK_MODULE] if isinstance(stage, LaunchedStage) else [])
    return content_key("stage", stage.name, modules, stage.config, inputs)


def run(stage: Stage, ws: Workspace, **inputs: Path | None) -> Any:
    """The stage's result: reused from its verified folder, or computed there (a launched stage on its ranks)."""
    if sorted(inputs) != sorted(stage.inputs):
        raise TypeError(f"stage {stage.name} declares inputs {sorted(stage.inputs)}, got {sorted(inputs)}")
    key = stage_key(stage, inputs)
    out_dir, rel = ws.output(stage.store, key), f"{stage.store}/{key[: ws.KEY_CHARS]}"
    tag = f"{stage.store.replace('/', '.')}.{out_dir.name}"
    tag_active_run(f"llmforge.out.{tag}", rel)
    reused = reuse(stage, out_dir, ws)
    if reused is not None:
        print(f"stage {stage.name}: reused {rel} (verified against its record)")
        tag_active_run(f"llmforge.cache.{tag}", "hit")
        point_latest(ws.latest(stage.store), out_dir)
        return reused
    with stage_run(ws, stage.name, stage.config, run_key=key, tags={f"llmforge.out.{tag}": rel},
                   config_key=stage.name) as mlflow_run:
        spec = stage.prepare(inputs, out_dir)  # a bad input fails here, before the folder or the ranks exist
        job = write_launch(stage, spec, inputs, out_dir, ws, mlflow_run.info.run_id)
        launched = prefect_task(launch, f"{stage.name}-launch")
        launched(RANK_MODULE, ["--job", str(job)], **launch_settings(stage.config), log=_task_log,
                 log_file=out_dir / LAUNCH_LOG)
        result = stage.after(read_result(stage, out_dir), inputs, ws.run_reports(mlflow_run.info.run_id))
    write_result(result, out_dir, ws)
    write_record(out_dir, key, stage.name)
    tag_active_run(f"llmforge.cache.{tag}", "miss")
    point_latest(ws.latest(stage.store), out_dir)
    release_freed_memory()
    return result


def reuse(stage: Stage, out_dir: Path, ws: Workspace) -> Any | None:
    """The result of a complete, verified earlier run of this key; None (and a line saying why) otherwise."""
    if not (out_dir / RESULT_FILE).is_file():
        return None
    problem = verify_record(out_dir)
    if problem is not None:
        print(f"stage {stage.name}: output {out_dir} failed verification ({problem}); rerunning it")
        return None
    data = json.loads((out_dir / RESULT_FILE).read_text(encoding="utf-8"))
    return stage.Result.model_validate(from_workspace(data, ws))


def write_result(result: BaseModel, out_dir: Path, ws: Workspace) -> Path:
    """out_dir/result.json with every path inside the workspace written relative to it ("./checkpoints/...")."""
    return write_json_atomic(out_dir / RESULT_FILE, to_workspace(result.model_dump(mode="json"), ws))


def write_launch(stage: LaunchedStage, spec: Launch, inputs: dict[str, Path | None], out_dir: Path, ws: Workspace,
                 mlflow_run_id: str | None) -> Path:
    """Check a resume, then write the config file, ds_config.json and job.json; the job's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = {stage.name: stage.config.model_dump(mode="json"), **spec.identity}
    check_resume_compatible(stage, out_dir, resolved)
    write_json_atomic(out_dir / stage.config_file, resolved)
    write_json_atomic(out_dir / DS_CONFIG_FILE, spec.ds_config)
    (out_dir / RESULT_FILE).unlink(missing_ok=True)  # a stale result must never pass for this run's
    job = Job(stage=stage.path(), config=stage.config.model_dump(mode="json"),
              inputs={k: Path(v).resolve() if v is not None else None for k, v in inputs.items()},
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


def prefect_task(fn: Any, name: str) -> Any:
    """`fn` as a Prefect task inside a flow run (its log streams into the UI), else `fn` itself."""
    from prefect import task
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return fn
    return task(fn, name=name, task_run_name=name, cache_policy=None)


def _task_log(line: str) -> None:
    """A launcher line into the Prefect task's log (stdout outside one)."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        get_run_logger().info(line)
    except MissingContextError:
        print(line, flush=True)


def in_run(stage: LaunchedStage, ws: Workspace, out_dir: Path, *, log: Any = print, **inputs: Path | None) -> Any:
    """Launch `stage` into `out_dir` with no cache or folder key (tests, resumes into a chosen folder),
    inside its own MLflow stage run; the result its rank 0 wrote."""
    out_dir = Path(out_dir)
    with stage_run(ws, stage.name, stage.config, config_key=stage.name) as mlflow_run:
        job = write_launch(stage, stage.prepare(inputs, out_dir), inputs, out_dir, ws, mlflow_run.info.run_id)
        launch(RANK_MODULE, ["--job", str(job)], **launch_settings(stage.config), log=log)
        return read_result(stage, out_dir)


def read_result(stage: Stage, out_dir: Path) -> Any:
    """The result.json the ranks' rank 0 wrote last."""
    path = out_dir / RESULT_FILE
    if not path.is_file():
        raise RuntimeError(f"the {stage.name} ranks exited cleanly but wrote no {path}; see the log above")
    return stage.Result.model_validate_json(path.read_text(encoding="utf-8"))

