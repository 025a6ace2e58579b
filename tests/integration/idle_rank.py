"""A training rank that joins the process group and then waits: what the stop tests stop.

    python -m tests.integration.idle_rank --job job.json   (through the deepspeed launcher)

It runs through the real rank skeleton (tasks/training/worker.py), so the supervisor watch
and the shared-memory release under test are the ones every stage's ranks use.
"""
from __future__ import annotations

import sys
import time

import torch

from tasks.training.launch import StageJob
from tasks.training.worker import main


class IdleJob(StageJob):
    """`wait_s`: how long each rank waits after its first all-reduce (the stop tests interrupt it)."""

    config: dict = {}
    wait_s: float = 600.0


def run_rank(job: IdleJob, rank: int, world: int) -> None:
    import torch.distributed as dist

    t = torch.ones(8)
    dist.all_reduce(t)  # the CPU all-reduce maps this rank's /dev/shm buffer
    print(f"rank {rank}/{world} ready", flush=True)
    deadline = time.monotonic() + job.wait_s
    while time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(None, IdleJob, run_rank, __doc__))
