"""The one DeepSpeed engine builder, and the process-group set-up every training stage shares.

    rank, world = init_distributed()                  # join the launcher's group, or make a one-rank one
    engine = build_engine(model, cfg.optim, cfg.launch, micro_batch_size, grad_accum, steps)  # our AdamW (+ LambdaLR)

DeepSpeed never builds the optimizer or the LR schedule: both come from models/optim.py, so
pretraining, SFT and GRPO step their weights the same way.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import torch

from infra.launch.build_lock import BUILDING_SHM_OP
from infra.launch.launcher import build_ds_config, free_port, remove_shm_buffers, resolve_precision
from infra.launch.runner import import_deepspeed  # DeepSpeed without its unused MLflow import: ~3 s a rank
from models.optim import GuardedAdamW, build_adamw, build_scheduler
from tasks.training.config import LaunchConfig, OptimConfig


@dataclass(frozen=True)
class Schedule:
    """What models.optim.lr_at reads: the optim component's warmup and schedule over the stage's steps."""

    warmup_steps: int
    max_steps: int
    min_lr_ratio: float
    schedule: str = "cosine"

    @classmethod
    def of(cls, optim: OptimConfig, steps: int) -> "Schedule | None":
        """The schedule of `optim` over `steps`; None for a constant lr (no LambdaLR at all)."""
        if optim.schedule == "constant" and optim.warmup_steps == 0:
            return None
        return cls(optim.warmup_steps, steps, optim.min_lr_ratio, optim.schedule)


def ds_config_for(optim: OptimConfig, launch: LaunchConfig, micro_batch_size: int, grad_accum: int) -> dict[str, Any]:
    """The DeepSpeed config the ranks train with: the ZeRO stage's JSON, the batch shape, the precision
    (`auto` measured on this machine) and where clipping happens (ours in GuardedAdamW on the plain fp32 path)."""
    precision = resolve_precision(launch.precision)
    if launch.tp > 1 and precision == "bf16":
        raise ValueError(f"launch.tp={launch.tp} with precision {launch.precision} (bf16 here): DeepSpeed's bf16 "
                         "optimizer flattens the weights, which tensor-parallel DTensors refuse; set launch.precision: fp32")
    ds_config = build_ds_config(launch.zero, precision, micro_batch_size, grad_accum, optim.grad_clip)
    if guarded_step(launch.zero, precision):
        ds_config["gradient_clipping"] = 0.0
    return ds_config


def guarded_step(zero: str, precision: str) -> bool:
    """Whether the optimizer is GuardedAdamW: without a ZeRO/bf16 wrapper DeepSpeed steps our optimizer even
    on NaN gradients and does not report the grad norm; GuardedAdamW clips, reports and skips instead."""
    return zero == "zero0" and precision == "fp32"


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
    import torch.distributed as dist

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
    left one file per rank behind (66 MB each). Unlinked, the memory lives while the ranks have it
    mapped and goes back to the kernel however they end, a SIGKILL included.
    """
    import torch.distributed as dist

    if os.environ.get("DS_ACCELERATOR") != "cpu" or "MASTER_PORT" not in os.environ:
        return
    if dist.get_world_size() > 1:
        dist.barrier()  # every rank is past DeepSpeed's init, which opens all the others' buffers
    remove_shm_buffers(int(os.environ["MASTER_PORT"]), dist.get_rank())


def build_engine(model: torch.nn.Module, optim: OptimConfig, launch: LaunchConfig, micro_batch_size: int,
                 grad_accum: int, steps: int, ds_config: dict[str, Any] | None = None, layout=None):
    """A DeepSpeed engine around `model` with our AdamW and lr schedule; `ds_config` (what the stage wrote in
    ds_config.json) defaults to `ds_config_for` the same settings. `layout` (tasks/training/parallel.py's
    RankLayout, None: plain data parallel): with pp > 1 `model` is already its PipelineModule; with tp > 1
    it is split here."""
    init_distributed()
    deepspeed = import_deepspeed()

    ds_config = dict(ds_config or ds_config_for(optim, launch, micro_batch_size, grad_accum))
    precision = "bf16" if ds_config.get("bf16", {}).get("enabled") else "fp32"
    adamw = dict(lr=optim.lr, weight_decay=optim.weight_decay, betas=optim.betas, kernel=optim.kernel)
    # The pipeline's stages each hold some layers: their grad norm is summed over the stages of a replica.
    norm_group = model._grid.get_pipe_parallel_group() if layout is not None and layout.pp > 1 else None

    def optimizer_of(module: torch.nn.Module) -> torch.optim.Optimizer:
        if guarded_step(launch.zero, precision):
            return GuardedAdamW(module, max_grad_norm=optim.grad_clip, norm_group=norm_group, **adamw)
        return build_adamw(module, **adamw)

    schedule = Schedule.of(optim, steps)
    if layout is not None and layout.tp > 1:
        return _tensor_parallel_engine(model, layout, optimizer_of, schedule, ds_config)
    optimizer = optimizer_of(model)
    scheduler = build_scheduler(optimizer, schedule) if schedule is not None else None
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    if launch.torch_compile:
        # DeepSpeed's own entry point: `model.compile()` in place, after its ZeRO hooks are set, so the
        # state dict (checkpoints, export) keeps the same keys as an uncompiled run's.
        engine.compile()
    return engine


def _tensor_parallel_engine(model, layout, optimizer_of, schedule, ds_config):
    """The engine of a model split by models/tensor_parallel.py over each replica's tp ranks.

    DeepSpeed moves its module with `module.to(device)`, which cannot swap DTensor parameters (its
    debug name table holds weak references to them); the model is therefore split inside the optimizer
    factory DeepSpeed calls after that move. DeepSpeed's gradient all-reduce flattens tensors, which
    DTensors refuse: it is turned off, and the replicas' shards are averaged before each optimizer step.
    """
    deepspeed = import_deepspeed()

    from models.tensor_parallel import parallelize, reduce_data_parallel_grads
    from tasks.training.parallel import TensorParallelGroups

    groups = TensorParallelGroups(layout.dp, layout.tp)
    scheduler = (lambda optimizer: build_scheduler(optimizer, schedule)) if schedule is not None else None
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=lambda _: optimizer_of(parallelize(model, groups.tp_mesh)),
                                           lr_scheduler=scheduler, config=ds_config, mpu=groups)
    engine.enable_backward_allreduce = False
    engine.optimizer.register_step_pre_hook(lambda *_: reduce_data_parallel_grads(model, groups.dp_group, layout.dp))
    # DeepSpeed's checkpoint loaders pass torch.load a callable map_location, with which torch cannot unpickle a
    # DTensor (weights and Adam moments here): the rank's own device instead.
    load = engine.checkpoint_engine.load
    engine.checkpoint_engine.load = lambda path, map_location=None: load(
        path, map_location=engine.device if callable(map_location) else map_location)
    return engine


def full_parameters(model: torch.nn.Module, zero: str):
    """Context in which every rank sees whole parameters (ZeRO-3 keeps only a shard per rank)."""
    if zero != "zero3":
        return contextlib.nullcontext()
    deepspeed = import_deepspeed()

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


def all_gather(obj: Any, world: int) -> list[Any]:
    """`obj` of every rank, in rank order (no communication on one rank)."""
    import torch.distributed as dist

    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out
