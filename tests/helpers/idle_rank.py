"""A training stage whose ranks join the process group and then wait: what the stop tests stop.

    deepspeed --module tasks.training.rank --job job.json   (job.stage = tests.helpers.idle_rank:Idle)

It runs through the real rank entry point (tasks/training/rank.py `main`), so the supervisor watch
and the shared-memory release under test are the ones every stage's ranks use.
"""
from __future__ import annotations

import time

import torch

from infra.config import StrictModel
from infra.stages import LaunchedStage
from tasks.training.config import LaunchConfig


class IdleConfig(StrictModel):
    wait_s: float = 600.0  # how long each rank waits after its first all-reduce (the stop tests interrupt it)
    launch: LaunchConfig = LaunchConfig()


class Idle(LaunchedStage):
    name, store = "idle", "idle"
    Config, Result = IdleConfig, IdleConfig

    def model(self) -> torch.nn.Module:
        import torch.distributed as dist

        t = torch.ones(8)
        dist.all_reduce(t)  # the CPU all-reduce maps this rank's /dev/shm buffer
        print(f"rank {dist.get_rank()}/{dist.get_world_size()} ready", flush=True)
        deadline = time.monotonic() + self.config.wait_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
        raise SystemExit(0)
