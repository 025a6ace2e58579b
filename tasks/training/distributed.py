"""The ranks' process groups: joining the launcher's group, the tensor-parallel mesh, and gathering from every rank.

    rank, world = init_distributed()      # join the launcher's group, or make a one-rank one
    groups = TensorParallelGroups(dp, tp) # the (dp, tp) mesh, and what DeepSpeed asks a model-parallel unit for
    everyone = all_gather(obj, world)     # obj of every rank, in rank order
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from infra.launch.build_lock import BUILDING_SHM_OP
from infra.launch.launcher import free_port, remove_shm_buffers
from infra.launch.runner import import_deepspeed  # DeepSpeed without its unused MLflow import: seconds saved a rank


def _shm_op_built() -> bool:
    """Whether torch's extension cache already holds DeepSpeed's compiled CPU communication op."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    return any(root.glob("*/deepspeed_shm_comm/*.so")) or any(root.glob("deepspeed_shm_comm/*.so"))


def init_distributed() -> tuple[int, int]:
    """Join the process group the launcher described, or make a one-rank group in this process.

    Returns (rank, world size). DeepSpeed's engine reads LOCAL_RANK etc. from the environment,
    so the single-process case sets them (only if absent) before initialising.
    """
    if not torch.cuda.is_available():
        # DeepSpeed picks its accelerator at import; without CUDA only the CPU one works.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    deepspeed = import_deepspeed()
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            for key, value in {
                "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            }.items():
                os.environ.setdefault(key, value)
        if os.environ.get("DS_ACCELERATOR") == "cpu" and not _shm_op_built() and os.environ.get("RANK", "0") == "0":
            print(BUILDING_SHM_OP, flush=True)
        deepspeed.init_distributed(auto_mpi_discovery=False, verbose=False)
        _unlink_shm_names()
    return dist.get_rank(), dist.get_world_size()


def _unlink_shm_names() -> None:
    """Unlink this rank's /dev/shm all-reduce buffer once every rank has mapped every buffer.

    DeepSpeed's CPU all-reduce maps the buffers at init and never unlinks them, so each launch
    would leave one file per rank behind. Unlinked, the memory lives while the ranks have it
    mapped and goes back to the kernel however they end, a SIGKILL included.
    """
    if os.environ.get("DS_ACCELERATOR") != "cpu" or "MASTER_PORT" not in os.environ:
        return
    if dist.get_world_size() > 1:
        dist.barrier()  # every rank is past DeepSpeed's init, which opens all the others' buffers
    remove_shm_buffers(int(os.environ["MASTER_PORT"]), dist.get_rank())


def data_group(engine):
    """The process group of this rank's data-parallel replicas (all ranks unless tensor parallel splits them):
    a step's stats are summed over it, as each replica's tp ranks hold the same loss."""
    return getattr(engine, "data_parallel_group", None)


class TensorParallelGroups:
    """The (dp, tp) device mesh, and what DeepSpeed asks a model-parallel unit (`mpu`) for: it then reduces
    gradients over each replica's dp group, not over ranks holding different shards."""

    def __init__(self, dp: int, tp: int) -> None:
        self.mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (dp, tp),
                                     mesh_dim_names=("dp", "tp"))
        self.tp_mesh = self.mesh["tp"]
        self.tp_group, self.dp_group = self.mesh.get_group("tp"), self.mesh.get_group("dp")

    def get_model_parallel_rank(self) -> int:
        return dist.get_rank(self.tp_group)

    def get_model_parallel_world_size(self) -> int:
        return self.tp_mesh.size()

    def get_model_parallel_group(self):
        return self.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(self.dp_group)

    def get_data_parallel_world_size(self) -> int:
        return self.mesh["dp"].size()

    def get_data_parallel_group(self):
        return self.dp_group


def all_gather(obj: Any, world: int) -> list[Any]:
    """`obj` of every rank, in rank order (no communication on one rank)."""
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out
