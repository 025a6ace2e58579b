"""The stage side every training stage shares: write the run's files, launch the worker ranks, read the result.

    run_stage(spec, out_dir, resolved, job, ds_config=...)
      out_dir/<spec.config_file>   resolved config (what the run trains with)
      out_dir/ds_config.json       the DeepSpeed config the ranks train with (read by them, not rebuilt)
      out_dir/job.json             what the worker ranks read
      out_dir/result.json          what the worker's rank 0 writes last, read back here

A rerun into an out_dir that holds checkpoints resumes them, so it must train the same thing:
`check_resume_compatible` refuses one whose settings differ in anything but the stage's
resume-neutral keys.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from infra.atomic import write_json_atomic
from infra.config import StrictModel, flatten_params
from infra.deepspeed_launch import launch
from infra.paths import Workspace
from infra.tracking import stage_run

JOB_FILE = "job.json"  # what a stage's worker ranks read
RESULT_FILE = "result.json"  # what its rank 0 writes last
DS_CONFIG_FILE = "ds_config.json"
CHECKPOINTS_DIR = "checkpoints"

R = TypeVar("R", bound=BaseModel)


class StageJob(StrictModel):
    """What every stage's worker reads from out_dir/job.json; each stage adds its inputs and `config`."""

    tokenizer_path: Path
    out_dir: Path
    ws_root: Path
    mlflow_run_id: str | None
    precision: Literal["fp32", "bf16"]  # what the stage resolved `launch.precision` to, and why
    precision_reason: str


class ExportedModel(BaseModel):
    """The part of every stage's result.json that says where the trained model went."""

    out_dir: Path
    model_dir: Path
    hf_dir: Path | None
    mlflow_run_id: str | None


@dataclass(frozen=True)
class StageSpec:
    """How one training stage lays out its out_dir and names itself."""

    name: str  # the MLflow stage ("pretrain", "sft", "grpo"); also the section of the resolved config
    label: str  # in messages ("pretrain", "SFT", "GRPO")
    worker_module: str
    config_file: str
    # Keys (dotted, or a whole component) of the config section that may differ on a resume;
    # None: the stage keeps no checkpoints.
    resume_neutral: frozenset[str] | None = None
    # Other keys of the resolved config that must match on a resume, with how a message names them.
    resume_identity: dict[str, str] = field(default_factory=dict)


def check_resume_compatible(spec: StageSpec, out_dir: Path, resolved: dict[str, Any]) -> None:
    """Refuse to resume out_dir's checkpoints with settings that change what is trained."""
    old_path = out_dir / spec.config_file
    if spec.resume_neutral is None or not old_path.is_file() or not (out_dir / CHECKPOINTS_DIR / "latest").is_file():
        return
    old = json.loads(old_path.read_text(encoding="utf-8"))
    section_old, section_new = flatten_params(old[spec.name]), flatten_params(resolved[spec.name])
    neutral = spec.resume_neutral
    changed = sorted(
        k for k in set(section_old) | set(section_new)
        if not any(k == n or k.startswith(n + ".") for n in neutral) and section_old.get(k) != section_new.get(k)
    )
    changed += [label for key, label in spec.resume_identity.items() if old.get(key) != resolved[key]]
    if changed:
        raise ValueError(
            f"{out_dir} holds checkpoints of a run with different settings ({', '.join(changed)}); "
            "use a new out_dir, or delete its checkpoints/ folder to start over"
        )


def launch_job(
    module: str,
    job: BaseModel,
    out_dir: Path,
    result_type: type[R],
    stage: str,
    num_procs: int = 1,
    hostfile: Path | None = None,
    log: Callable[[str], Any] = print,
    launcher_args: list[str] | None = None,
) -> R:
    """Write `job` to out_dir/job.json, launch `module --job job.json` through DeepSpeed, and read back
    the out_dir/result.json that its rank 0 writes."""
    result_path = out_dir / RESULT_FILE
    result_path.unlink(missing_ok=True)  # a stale result must never pass for this run's
    job_path = write_json_atomic(out_dir / JOB_FILE, job)
    launch(module, ["--job", str(job_path.resolve())], num_procs=num_procs, hostfile=hostfile, log=log,
           launcher_args=launcher_args)
    if not result_path.is_file():
        raise RuntimeError(f"the {stage} workers exited cleanly but wrote no {result_path}; see the log above")
    return result_type.model_validate_json(result_path.read_text(encoding="utf-8"))


def run_stage(
    spec: StageSpec,
    out_dir: Path,
    resolved: dict[str, Any],
    job: StageJob,
    result_type: type[R],
    *,
    ds_config: dict[str, Any] | None = None,
    num_procs: int = 1,
    hostfile: Path | None = None,
    launcher_args: list[str] | None = None,
    log: Callable[[str], Any] = print,
) -> R:
    """Check a resume, write the resolved config (and ds_config.json), launch the worker ranks; their result."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_resume_compatible(spec, out_dir, resolved)
    write_json_atomic(out_dir / spec.config_file, resolved)
    if ds_config is not None:
        write_json_atomic(out_dir / DS_CONFIG_FILE, ds_config)
    return launch_job(spec.worker_module, job, out_dir, result_type, spec.label, num_procs=num_procs,
                      hostfile=hostfile, log=log, launcher_args=launcher_args)


def saved_model_config(model_dir: Path, tokenizer_path: Path, hint: str):
    """The models.llama.ModelConfig of a saved model, checked to cover the tokenizer's vocabulary (`hint`: what to do if not)."""
    from models.export import load_config
    from tasks.tokenizer.train import load_tokenizer

    mcfg = load_config(model_dir)
    vocab_size = load_tokenizer(tokenizer_path).get_vocab_size()
    if mcfg.vocab_size < vocab_size:
        raise ValueError(f"{model_dir} has vocab_size={mcfg.vocab_size} but {tokenizer_path} has {vocab_size} "
                         f"tokens; {hint}")
    return mcfg


def job_fields(tokenizer_path: Path, out_dir: Path, ws_root: Path | str | None, mlflow_run_id: str | None,
               precision: str) -> dict:
    """The StageJob fields, as absolute paths, with `precision` resolved ("auto": measured on this machine)."""
    from infra.precision import choose_precision

    choice = choose_precision(precision)
    return dict(tokenizer_path=Path(tokenizer_path).resolve(), out_dir=Path(out_dir).resolve(),
                ws_root=Workspace.locate(ws_root).root, mlflow_run_id=mlflow_run_id,
                precision=choice.precision, precision_reason=choice.reason)


def in_stage_run(stage: str, cfg: BaseModel, ws_root: str | Path | None, mlflow_run_id: str | None,
                 run: Callable[[str, Path], R]) -> R:
    """`run(mlflow_run_id, ws_root)` with the given run id, or inside a new `stage` MLflow run when it is None."""
    ws = Workspace.locate(ws_root)
    if mlflow_run_id is not None:
        return run(mlflow_run_id, ws.root)
    with stage_run(ws, stage, config=cfg) as opened:
        return run(opened.info.run_id, ws.root)
