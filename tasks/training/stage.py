"""What every training stage shares around the one loop: its base class, its run, its export, its result.

The stage's base, its MLflow run on rank 0, the export of the trained model and the result it publishes.

    class Pretrain(TrainingStage)          a LaunchedStage whose ranks run tasks/training/rank.py
    launch_of(cfg, ...)                    stage side: ds_config.json and the precision the ranks train in
    saved_model_config(model_dir, ...)     stage side: a saved model's architecture, checked against the tokenizer
    with rank0_run(job, rank)              rank 0 logs into the stage's MLflow run; the others log nothing
    exported(trained, job, rank, ...)      rank 0 exports the trained model (+ a Hugging Face folder) and plots
    publish(run, out_dir, result, ...)     atomic result.json, final metrics and artifacts
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from infra.launch.precision import choose_precision
from infra.stages import DS_CONFIG_FILE, RESULT_FILE, Job, Launch, LaunchedStage
from infra.tracking.runs import log_artifact, log_config, log_metrics, stage_run
from infra.workspace.atomic import write_json_atomic
from infra.workspace.paths import Workspace
from models.export import HF_DIR, export_hf_llama, load_config, save_model
from tasks.tokenizer.train import load_tokenizer, tokenizer_json
from tasks.training.config import RESUME_NEUTRAL
from tasks.training.engine import ds_config_for, full_parameters
from tasks.training.loss_curve import loss_curve
from tasks.training.types import TrainResult

LOSS_CURVE_FILE = "loss_curve.png"
MODEL_DIR = "model"


class TrainingStage(LaunchedStage):
    """A training stage (pretraining, SFT, GRPO): its config composes the shared components, so a resume may
    change the same keys in each (how it logs, checkpoints and runs: RESUME_NEUTRAL)."""

    resume_neutral = RESUME_NEUTRAL
    rank_module = "tasks.training.rank"  # every rank's entry point, which trains with the one loop


class ExportedModel(BaseModel):
    """The part of every training stage's result.json that says where the trained model went."""

    out_dir: Path
    model_dir: Path
    hf_dir: Path | None
    mlflow_run_id: str | None
    # How the ranks were laid out (dp{n}_tp{n}_pp{n}), the memory plan's per-device estimate for that layout
    # (models/memory_plan.py) and each rank's measured peak (RSS on the CPU, max_memory_allocated on a GPU).
    layout: str | None = None
    world_size_used: int | None = None
    plan_bytes_per_device: int | None = None
    peak_bytes_per_rank: list[int] = []


@contextlib.contextmanager
def rank0_run(job: Job, stage: str, rank: int) -> Iterator[Any]:
    """Rank 0: the MLflow run the stage side opened (job.mlflow_run_id), or a new one; other ranks: None."""
    if rank != 0:
        yield None
        return
    config = job.config if job.mlflow_run_id is None else None
    with stage_run(Workspace.locate(job.ws_root), stage, config=config, run_id=job.mlflow_run_id, config_key=stage) as run:
        # Decided once, where the stage wrote ds_config.json (`auto`: by a measurement on that machine).
        log_config({"precision_used": job.precision, "precision_reason": job.precision_reason})
        print(f"{stage}: training in {job.precision} ({job.precision_reason})", flush=True)
        yield run


def read_ds_config(job: Job) -> dict[str, Any]:
    """The DeepSpeed config the stage wrote for this launch: the ranks train with exactly this file."""
    return json.loads((job.out_dir / DS_CONFIG_FILE).read_text(encoding="utf-8"))


def export_model(model: torch.nn.Module, job: Job, export_hf: bool) -> tuple[Path, Path | None]:
    """out_dir/model (models.export.save_model) and, when asked, out_dir/hf for transformers."""
    model_dir = save_model(model, job.out_dir / MODEL_DIR)
    hf_dir = None
    if export_hf:
        hf_dir = export_hf_llama(model, job.out_dir / HF_DIR,
                                        tokenizer_json=tokenizer_json(job.inputs.get("tokenizer")))
    return model_dir, hf_dir


@dataclass
class Exported:
    """Rank 0's view of a finished run: the loop's result, the exported model, the loss curve."""

    result: TrainResult
    model_dir: Path
    hf_dir: Path | None
    loss_curve: Path | None
    n_params: int


def exported(trained: TrainResult, job: Job, rank: int, zero: str, export_hf: bool, curve_title: str) -> Exported | None:
    """Rank 0 exports the trained model and plots its loss curve; other ranks get None (ZeRO-3 gathers first;
    tensor- and pipeline-parallel ranks send rank 0 their shards and stages, so every layout exports the same
    whole model)."""
    engine, layout = trained.engine, trained.layout
    with full_parameters(engine.module, zero):
        model = layout.whole_model(engine, engine.module.cfg) if layout is not None else engine.module
        if rank != 0:
            return None
        model_dir, hf_dir = export_model(model, job, export_hf)
        n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if trained.resumed_from is not None:
        print(f"resumed from step {trained.resumed_from}: this launch trained steps "
              f"{trained.resumed_from + 1}-{trained.steps}")
    curve = loss_curve(trained, job.out_dir / LOSS_CURVE_FILE, curve_title)
    return Exported(trained, model_dir, hf_dir, curve, n_params)


def publish(run: Any, out_dir: Path, result: BaseModel, metrics: dict[str, float | int | None], step: int,
            artifacts: Sequence[Path | None] = (), memory: dict[str, Any] | None = None) -> None:
    """Write out_dir/result.json atomically, then log `metrics` and result.json + `artifacts` to `run`; `memory`
    (TrainResult.memory: layout, planned and measured bytes) goes into both."""
    memory = memory or {}
    if memory and isinstance(result, ExportedModel):
        result = result.model_copy(update={"layout": memory["layout"], "world_size_used": memory["world_size"],
                                           "plan_bytes_per_device": memory["plan_bytes_per_device"],
                                           "peak_bytes_per_rank": memory["peak_bytes_per_rank"]})
    path = write_json_atomic(out_dir / RESULT_FILE, result)
    if run is None:
        return
    log_metrics({**metrics, **memory_metrics(memory)}, step=step)
    if memory:
        log_config({"layout": memory["layout"], "world_size": memory["world_size"]})
    for artifact in (path, *artifacts):
        if artifact is not None:
            log_artifact(artifact)


def memory_metrics(memory: dict[str, Any]) -> dict[str, float | None]:
    """The plan's per-device estimate beside the measured peak (the largest rank's, and each rank's)."""
    if not memory:
        return {}
    peaks = memory["peak_bytes_per_rank"]
    return {"plan_bytes_per_device": memory["plan_bytes_per_device"], "peak_bytes_max_rank": float(max(peaks)),
            **{f"peak_bytes_rank{i}": float(p) for i, p in enumerate(peaks)}}


def saved_model_config(model_dir: Path, tokenizer_path: Path, hint: str):
    """The models.llama.ModelConfig of a saved model, checked to cover the tokenizer's vocabulary (`hint`: what to do if not)."""
    mcfg = load_config(model_dir)
    vocab_size = load_tokenizer(tokenizer_path).get_vocab_size()
    if mcfg.vocab_size < vocab_size:
        raise ValueError(f"{model_dir} has vocab_size={mcfg.vocab_size} but {tokenizer_path} has {vocab_size} "
                         f"tokens; {hint}")
    return mcfg


def launch_of(cfg: Any, micro_batch_size: int, grad_accum: int, **kw: Any) -> Launch:
    """What a training stage's `prepare` hands the runner: the ds_config.json its ranks train with and the
    precision `launch.precision` resolves to here (`auto`: measured on this machine), plus `kw` (extra, identity)."""
    choice = choose_precision(cfg.launch.precision)
    return Launch(ds_config_for(cfg.optim, cfg.launch, micro_batch_size, grad_accum), choice.precision, choice.reason,
                  **kw)
