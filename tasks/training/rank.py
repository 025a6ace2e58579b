"""One DeepSpeed rank of a launched training stage: `deepspeed --module tasks.training.rank --job out_dir/job.json`.

The job names the stage (`tasks.training.pretrain.stage:Pretrain`); this rebuilds it from job.json, takes its
model, its Steps and its batch shape, trains them with the one loop (`fit`) on the job's ds_config.json, and lets
the stage's rank 0 export the model and write result.json (`finish`).

`--queue DIR` instead trains the runs of DIR/queue.json one after another, each exactly as it would train alone
(its own seed, engine, MLflow run and result.json). Several launches side by side share the queue: before each
run, rank 0 claims the next unclaimed one (a file created with O_EXCL, so two launches never take the same) and
tells its other ranks. A flow of many short runs
(infra/run_queue.py) so pays the launcher's, the interpreter's and the imports' start-up once per launch, and
its launches finish together. Around each run rank 0 prints RUN_STARTED and RUN_DONE with the run's folder,
which the launching side watches for.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from infra.launch.launcher import remove_shm_buffers
from infra.lifecycle.process_tree import watch_supervisor
from infra.stages import CHECKPOINTS_DIR, QUEUE_FILE, RUN_DONE, RUN_STARTED, Job
from tasks.training.distributed import init_distributed
from tasks.training.loop import fit
from tasks.training.metrics import ListSink, MlflowSink
from tasks.training.parallel import RankLayout, reset_peak_bytes
from tasks.training.stage import rank0_run, read_ds_config
from tasks.training.stop import TrainingStopped


def main(argv: Sequence[str] | None = None) -> int:
    """Train the stage of job.json, or of each run claimed from the queue, on this rank; the exit status (128 + the
    signal when stopped by one)."""
    parser = argparse.ArgumentParser(description="One DeepSpeed rank of a training stage.")
    one = parser.add_mutually_exclusive_group(required=True)
    one.add_argument("--job", type=Path, help="job.json written by the stage's runner")
    one.add_argument("--queue", type=Path, help="a run queue's folder (infra/run_queue.py): train its runs as claimed")
    args = parser.parse_args(argv)
    port, rank_env = os.environ.get("MASTER_PORT"), int(os.environ.get("RANK", "0"))
    # A rank's parent is DeepSpeed's launcher; this ends it when the run's own process is gone
    # (its shared-memory buffer too, in case that happens before init_distributed unlinks it).
    watch_supervisor(on_lost=lambda: remove_shm_buffers(int(port), rank_env) if port else None)
    try:
        rank, world = init_distributed()
        for path in (claimed(args.queue, rank, world) if args.queue else [args.job]):
            if rank == 0:
                print(f"{RUN_STARTED} {path.parent}", flush=True)
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


def claimed(queue: Path, rank: int, world: int) -> Iterator[Path]:
    """The job.json paths of `queue` this launch claims, one at a time, until none is left: rank 0 claims the first
    unclaimed (queue/claim-<i>, created with O_EXCL) and broadcasts its index to the other ranks."""
    jobs = json.loads((queue / QUEUE_FILE).read_text(encoding="utf-8"))
    while True:
        choice = -1
        if rank == 0:
            for i in range(len(jobs)):
                try:
                    os.close(os.open(queue / f"claim-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    continue
                choice = i
                break
        if world > 1:
            shared = torch.tensor([choice], dtype=torch.long)
            dist.broadcast(shared, src=0)
            choice = int(shared.item())
        if choice < 0:
            return
        yield Path(jobs[choice])


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
