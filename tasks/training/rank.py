"""One DeepSpeed rank of a launched training stage: `deepspeed --module tasks.training.rank --job out_dir/job.json`.

The job names the stage (`tasks.training.pretrain.stage:Pretrain`); this rebuilds it from job.json, takes its
model, its Steps and its batch shape, trains them with the one loop (`fit`) on the job's ds_config.json, and lets
the stage's rank 0 export the model and write result.json (`finish`).

Several `--job` flags train several runs in one launch, one after another, each exactly as it would train alone
(its own seed, engine, MLflow run and result.json): a flow of many short runs (infra/run_queue.py) pays the
launcher's, the interpreter's and the imports' start-up once. After each, rank 0 prints RUN_DONE and the run's
folder, which the launching side watches for.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from infra.launch.launcher import remove_shm_buffers
from infra.lifecycle.process_tree import watch_supervisor
from infra.stages import CHECKPOINTS_DIR, RUN_DONE, Job
from tasks.training.distributed import init_distributed
from tasks.training.loop import fit
from tasks.training.metrics import ListSink, MlflowSink
from tasks.training.parallel import RankLayout, reset_peak_bytes
from tasks.training.stage import rank0_run, read_ds_config
from tasks.training.stop import TrainingStopped


def main(argv: Sequence[str] | None = None) -> int:
    """Train the stage of each job.json, in order, on this rank; the exit status (128 + the signal when stopped by one)."""
    parser = argparse.ArgumentParser(description="One DeepSpeed rank of a training stage.")
    parser.add_argument("--job", type=Path, action="append", required=True,
                        help="job.json written by the stage's runner; repeated, the runs train one after another")
    paths = parser.parse_args(argv).job
    port, rank_env = os.environ.get("MASTER_PORT"), int(os.environ.get("RANK", "0"))
    # A rank's parent is DeepSpeed's launcher; this ends it when the run's own process is gone
    # (its shared-memory buffer too, in case that happens before init_distributed unlinks it).
    watch_supervisor(on_lost=lambda: remove_shm_buffers(int(port), rank_env) if port else None)
    try:
        rank, world = init_distributed()
        for path in paths:
            train_job(Job.model_validate_json(path.read_text(encoding="utf-8")), rank, world)
            if rank == 0:
                print(f"{RUN_DONE} {path.parent}", flush=True)
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except TrainingStopped as stopped:
        print(f"rank {rank_env}: {stopped}", file=sys.stderr, flush=True)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        # Ctrl-C reaches every rank of the terminal's process group; one line each, not a traceback.
        print(f"rank {rank_env}: interrupted", file=sys.stderr)
        return 130
    return 0


def train_job(job: Job, rank: int, world: int) -> None:
    """One run: the stage job.json names, rebuilt, trained with the one loop and finished (rank 0 writes result.json)."""
    module, _, name = job.stage.partition(":")
    stage = getattr(importlib.import_module(module), name).for_job(job)
    if stage.config.launch.torch_threads is not None:
        torch.set_num_threads(stage.config.launch.torch_threads)
    reset_peak_bytes()  # this run's peak, not an earlier run's of the same launch
    layout = RankLayout.of(stage.config.launch, rank, world)
    with rank0_run(job, stage.name, rank) as run:
        model = stage.model()  # before its steps: GRPO's steps copy the model as their reference
        steps = stage.steps(layout.data_rank, layout.data_world)
        trained = fit(model, stage.config, steps, job.out_dir / CHECKPOINTS_DIR,
                      MlflowSink(rank) if rank == 0 else ListSink(), **stage.shape(), echo=print if rank == 0 else None,
                      ds_config=read_ds_config(job))
        stage.finish(trained, run, rank, world)
    del model, steps, trained
    gc.collect()  # the next run of this launch starts from what this one freed


if __name__ == "__main__":
    raise SystemExit(main())
