"""AdamW parameter groups and the learning-rate schedule shared by pretraining and SFT.

Weight decay goes on matrices only (embeddings, projections): decaying norm gains or
biases pulls them toward zero, which hurts, and they hold too few weights to overfit.
"""
from __future__ import annotations

import math
from typing import Literal, Protocol

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import _get_fused_kernels_supported_devices


class ScheduleConfig(Protocol):
    """What `lr_at` reads (`tasks.training.engine.Schedule`); `schedule` is "cosine" (the default) or "constant"."""

    warmup_steps: int
    max_steps: int
    min_lr_ratio: float


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed group (ndim >= 2) and a non-decayed one.

    Tied weights appear once (`named_parameters` de-duplicates shared tensors).
    Empty groups are dropped because some optimizers reject them.
    """
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


# How AdamW steps: "fused" (one kernel over all tensors), "foreach" (torch's multi-tensor ops),
# "for_loop" (one tensor at a time); "auto" is fused where torch has it for the parameters'
# device, else foreach. On the CPU torch picks the for-loop by default, which steps far slower
# than fused: hence "auto" (BENCHMARKS.md "Training step").
OptimizerKernel = Literal["auto", "fused", "foreach", "for_loop"]


def adamw_kernel(params: list[torch.Tensor], kernel: OptimizerKernel = "auto") -> dict[str, bool]:
    """The AdamW keyword arguments that select `kernel` for `params` ("auto": fused where supported)."""
    if kernel == "fused":
        return {"fused": True}
    if kernel == "foreach":
        return {"foreach": True}
    if kernel == "for_loop":
        return {"foreach": False}
    if kernel != "auto":
        raise ValueError(f"optimizer kernel '{kernel}' is not one of 'auto', 'fused', 'foreach', 'for_loop'")

    devices = {p.device.type for p in params}
    fused_ok = devices <= set(_get_fused_kernels_supported_devices()) and all(p.is_floating_point() for p in params)
    return {"fused": True} if fused_ok else {"foreach": True}


def build_adamw(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    kernel: OptimizerKernel = "auto",
) -> torch.optim.AdamW:
    """torch AdamW over `param_groups`, stepping with `kernel` (see OptimizerKernel)."""
    groups = param_groups(model, weight_decay)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **adamw_kernel(params, kernel))


def lr_at(step: int, cfg: ScheduleConfig) -> float:
    """LR multiplier at `step`: linear warmup to 1, then cosine decay to `min_lr_ratio` (or 1 for "constant").

    Returns a factor of the peak LR so it plugs straight into
    `LambdaLR(opt, lambda s: lr_at(s, cfg))`. Steps past `max_steps` stay at the floor.
    """
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        # (step + 1) so the very first update already moves the weights.
        return (step + 1) / cfg.warmup_steps
    if getattr(cfg, "schedule", "cosine") == "constant":
        return 1.0
    decay_steps = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / decay_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR driven by `lr_at`; its state_dict holds only the step count, so it resumes exactly."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg))


def _is_dtensor(t: torch.Tensor) -> bool:
    return isinstance(t, DTensor)


def _by_kind(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Tensor-parallel shards (DTensors, models/tensor_parallel.py) apart from plain tensors: torch's foreach
    ops refuse a mix."""
    split = [[t for t in tensors if _is_dtensor(t)], [t for t in tensors if not _is_dtensor(t)]]
    return [kind for kind in split if kind]


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float, counted: list[torch.Tensor] | None = None,
                   group=None) -> torch.Tensor:
    """torch's clip_grad_norm_ (max_norm 0: the norm only) over plain tensors and DTensors alike; a DTensor's
    norm is that of its whole matrix, not of this rank's shard. With `group` (pipeline stages: each holds
    some of the layers) the norm is over every rank's `counted` gradients (default: all of them; a weight
    two stages hold is counted by one). Returns the pre-clip norm."""
    counted = grads if counted is None else counted
    norms = [n.full_tensor() if _is_dtensor(n) else n for kind in _by_kind(counted) for n in torch._foreach_norm(kind)]
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else grads[0].new_zeros(())
    if group is not None:
        squares = total.double() ** 2
        dist.all_reduce(squares, group=group)
        total = squares.sqrt().to(total.dtype)
    if max_norm > 0:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for kind in _by_kind(grads):
            torch._foreach_mul_(kind, float(coef) if _is_dtensor(kind[0]) else coef)
    return total


class GuardedAdamW(torch.optim.AdamW):
    """AdamW over `param_groups(model)` that clips, reports the pre-clip grad norm and skips non-finite steps.

    DeepSpeed's ZeRO and bf16 wrappers already do this; the plain fp32 ZeRO-0 path steps the
    client optimizer directly, so this class gives it the same behaviour. DeepSpeed reads
    `overflow` (step skipped: no update, no LR-schedule step) and `_global_grad_norm` after
    each step.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        max_grad_norm: float = 0.0,
        kernel: OptimizerKernel = "auto",
        norm_group=None,
    ):
        groups = param_groups(model, weight_decay)
        params = [p for g in groups for p in g["params"]]
        super().__init__(groups, lr=lr, betas=betas, eps=eps, **adamw_kernel(params, kernel))
        self.max_grad_norm = max_grad_norm
        self.norm_group = norm_group  # pipeline parallel: the norm is over every stage's gradients
        self.overflow = False
        self._global_grad_norm: float | None = None

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            self.overflow, self._global_grad_norm = False, 0.0
            return None
        # DeepSpeed marks the copy of a tied weight that a later pipeline stage holds: counted once.
        counted = [p.grad for g in self.param_groups for p in g["params"]
                   if p.grad is not None and not getattr(p, "ds_pipe_replicated", False)]
        total = clip_grad_norm(grads, self.max_grad_norm, counted, self.norm_group)
        norm_value = float(total)  # one host sync per step, as a logged grad norm needs anyway
        self._global_grad_norm = norm_value
        self.overflow = not math.isfinite(norm_value)
        if self.overflow:
            return None
        return super().step(closure)
