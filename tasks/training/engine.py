"""The one DeepSpeed engine builder: our AdamW and schedule around the model, the stage's ds_config.json.

    engine = build_engine(model, cfg.optim, cfg.launch, micro_batch_size, grad_accum, steps)  # our AdamW (+ LambdaLR)

DeepSpeed never builds the optimizer or the LR schedule: both come from models/optim.py, so
pretraining, SFT and GRPO step their weights the same way.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from infra.launch.launcher import build_ds_config, resolve_precision
from infra.launch.runner import import_deepspeed  # DeepSpeed without its unused MLflow import: seconds saved a rank
from models.optim import GuardedAdamW, build_adamw, build_scheduler
from models.tensor_parallel import parallelize, reduce_data_parallel_grads
from tasks.training.config import LaunchConfig, OptimConfig
from tasks.training.distributed import TensorParallelGroups, init_distributed


@dataclass(frozen=True)
class Schedule:
    """What models.optim.lr_at reads: the optim component's warmup and schedule over the stage's steps."""

    warmup_steps: int
    max_steps: int
    min_lr_ratio: float
    schedule: str = "cosine"

    @classmethod
    def of(cls, optim: OptimConfig, steps: int, updates_per_step: int = 1) -> "Schedule | None":
        """The schedule of `optim` over `steps` loop steps of `updates_per_step` optimizer steps each (GRPO updates
        every sampled batch several times), counted in optimizer steps: the lr scheduler steps with the optimizer,
        so warmup and cosine end at the run's last optimizer step. None for a constant lr (no LambdaLR at all)."""
        if optim.schedule == "constant" and optim.warmup_steps == 0:
            return None
        return cls(optim.warmup_steps * updates_per_step, steps * updates_per_step, optim.min_lr_ratio, optim.schedule)


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


def build_engine(model: torch.nn.Module, optim: OptimConfig, launch: LaunchConfig, micro_batch_size: int,
                 grad_accum: int, steps: int, ds_config: dict[str, Any] | None = None, layout=None,
                 updates_per_step: int = 1):
    """A DeepSpeed engine around `model` with our AdamW and lr schedule over `steps` loop steps of
    `updates_per_step` optimizer steps; `ds_config` (what the stage wrote in ds_config.json) defaults to
    `ds_config_for` the same settings. `layout` (tasks/training/parallel.py's RankLayout, None: plain data
    parallel): with pp > 1 `model` is already its PipelineModule; with tp > 1 it is split here."""
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

    schedule = Schedule.of(optim, steps, updates_per_step)
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

