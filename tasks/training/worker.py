"""The rank side every training stage shares: `python -m tasks.training.<stage>.worker --job out_dir/job.json`.

    main(argv, job_type, run_rank)       parse --job, torch threads, init distributed, run, barrier, destroy
    with rank0_run(job, stage, rank)     rank 0 logs into the stage's MLflow run; the others log nothing
    train_and_export(...)                the loop (pretraining, SFT), then rank 0 exports the model
    publish(run, out_dir, result, ...)   atomic result.json, final metrics and artifacts
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import BaseModel

from infra.atomic import write_json_atomic
from infra.deepspeed_launch import remove_shm_buffers
from infra.process_tree import watch_supervisor
from infra.paths import Workspace
from infra.tracking import log_artifact, log_config, log_metrics, stage_run
from tasks.training.engine import full_parameters, init_distributed
from tasks.training.launch import CHECKPOINTS_DIR, DS_CONFIG_FILE, RESULT_FILE, StageJob
from tasks.training.config import TrainingConfig
from tasks.training.loop import BatchFn, LossFn, TrainResult, train
from tasks.training.metrics import ListSink, MlflowSink, loss_curve

J = TypeVar("J", bound=StageJob)
LOSS_CURVE_FILE = "loss_curve.png"
MODEL_DIR = "model"
HF_DIR = "hf"


def main(argv: Sequence[str] | None, job_type: type[J], run_rank: Callable[[J, int, int], Any], doc: str) -> int:
    """Read `--job`, join the process group, run `run_rank(job, rank, world)`, then leave the group together."""
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--job", type=Path, required=True, help="job.json written by the stage's run_* function")
    args = parser.parse_args(argv)
    job = job_type.model_validate_json(args.job.read_text(encoding="utf-8"))
    threads = job.config.launch.torch_threads
    if threads is not None:
        torch.set_num_threads(threads)
    port, rank_env = os.environ.get("MASTER_PORT"), int(os.environ.get("RANK", "0"))
    # A rank's parent is DeepSpeed's launcher; this ends it when the run's own process is gone
    # (its shared-memory buffer too, in case that happens before init_distributed unlinks it).
    watch_supervisor(on_lost=lambda: remove_shm_buffers(int(port), rank_env) if port else None)
    try:
        rank, world = init_distributed()
        run_rank(job, rank, world)
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank of the terminal's process group; one line each, not a traceback.
        print(f"rank {rank_env}: interrupted", file=sys.stderr)
        return 130
    return 0


@contextlib.contextmanager
def rank0_run(job: StageJob, stage: str, rank: int) -> Iterator[Any]:
    """Rank 0: the MLflow run the stage's task opened (job.mlflow_run_id), or a new one; other ranks: None."""
    if rank != 0:
        yield None
        return
    config = job.config if job.mlflow_run_id is None else None  # type: ignore[attr-defined]
    with stage_run(Workspace.locate(job.ws_root), stage, config=config, run_id=job.mlflow_run_id) as run:
        # Decided once, where the stage wrote ds_config.json (`auto`: by a measurement on that machine).
        log_config({"precision_used": job.precision, "precision_reason": job.precision_reason})
        print(f"{stage}: training in {job.precision} ({job.precision_reason})", flush=True)
        yield run


def read_ds_config(job: StageJob) -> dict[str, Any]:
    """The DeepSpeed config the stage wrote for this launch: the ranks train with exactly this file."""
    import json

    return json.loads((job.out_dir / DS_CONFIG_FILE).read_text(encoding="utf-8"))


def tokenizer_json(path: Path) -> Path | None:
    """The tokenizer.json of a tokenizer file or folder, or None when there is none."""
    from tasks.tokenizer.train import TOKENIZER_FILE

    candidate = path / TOKENIZER_FILE if path.is_dir() else path
    return candidate if candidate.is_file() else None


def export_model(model: torch.nn.Module, job: StageJob, export_hf: bool) -> tuple[Path, Path | None]:
    """out_dir/model (models.export.save_model) and, when asked, out_dir/hf for transformers."""
    from models import export

    model_dir = export.save_model(model, job.out_dir / MODEL_DIR)
    hf_dir = None
    if export_hf:
        hf_dir = export.export_hf_llama(model, job.out_dir / HF_DIR, tokenizer_json=tokenizer_json(job.tokenizer_path))
    return model_dir, hf_dir


@dataclass
class Trained:
    """Rank 0's view of a finished loop run: the result, the exported model, the loss curve."""

    result: TrainResult
    model_dir: Path
    hf_dir: Path | None
    loss_curve: Path | None
    n_params: int


def train_and_export(
    model: torch.nn.Module,
    job: StageJob,
    cfg: TrainingConfig,
    batches: tuple[BatchFn, BatchFn | None],
    loss_fn: LossFn,
    rank: int,
    *,
    export_hf: bool,
    curve_title: str,
    batch_tokens: Callable[[Any], int] | None = None,
) -> Trained | None:
    """Run the loop on this rank (checkpoints in out_dir/checkpoints); rank 0 exports and plots, others get None."""
    train_batches, eval_batches = batches
    sink = MlflowSink(rank) if rank == 0 else ListSink()
    result = train(
        model, cfg, train_batches, eval_batches, loss_fn, job.out_dir / CHECKPOINTS_DIR, sink,
        batch_tokens=batch_tokens, echo=print if rank == 0 else None, ds_config=read_ds_config(job),
    )
    with full_parameters(model, cfg.launch.zero):
        if rank != 0:
            return None
        model_dir, hf_dir = export_model(model, job, export_hf)
        n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if result.resumed_from is not None:
        print(f"resumed from step {result.resumed_from}: this launch trained steps {result.resumed_from + 1}-{result.steps}")
    curve = loss_curve(result, job.out_dir / LOSS_CURVE_FILE, curve_title)
    return Trained(result, model_dir, hf_dir, curve, n_params)


def publish(run: Any, out_dir: Path, result: BaseModel, metrics: dict[str, float | int | None], step: int,
            artifacts: Sequence[Path | None] = ()) -> None:
    """Write out_dir/result.json atomically, then log `metrics` and result.json + `artifacts` to `run`."""
    path = write_json_atomic(out_dir / RESULT_FILE, result)
    if run is None:
        return
    log_metrics(metrics, step=step)
    for artifact in (path, *artifacts):
        if artifact is not None:
            log_artifact(artifact)
