"""Pretraining's and SFT's step: micro-batches of a loss through forward, backward and the engine step.

`LossSteps` is what `tasks.training.loop.train` hands the one loop; batches are pure functions
of (micro-batch index, rank, world) built by `epoch_orders`, so a resume needs only the step.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tasks.training.config import TrainingConfig
from tasks.training.loop import Batch, BatchFn, LossFn, LossParts, StepStats
from tasks.training.metrics import perplexity


def epoch_orders(n: int, seed: int) -> Callable[[int], np.ndarray]:
    """epoch -> the order in which that epoch visits n samples, drawn from (seed, epoch).

    At most two epochs are kept: a batch can straddle one boundary.
    """
    orders: dict[int, np.ndarray] = {}

    def order(epoch: int) -> np.ndarray:
        if epoch not in orders:
            if len(orders) >= 2:
                orders.pop(min(orders))
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        return orders[epoch]

    return order



def _to_device(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def split_loss(out: torch.Tensor | tuple[torch.Tensor, LossParts]) -> tuple[torch.Tensor, LossParts]:
    """(loss, parts) of what a LossFn returned; a bare loss has no parts."""
    if isinstance(out, tuple):
        loss, parts = out
        return loss, parts
    return out, {}


def _sum_parts(sums: dict[str, torch.Tensor], parts: LossParts) -> None:
    for name, value in parts.items():
        value = torch.nan_to_num(value.detach().double(), nan=0.0, posinf=0.0, neginf=0.0)
        sums[name] = sums[name] + value if name in sums else value


def validation_losses(engine, eval_batches: BatchFn, loss_fn: LossFn, n_batches: int, rank: int,
                      world: int) -> tuple[float, dict[str, float]]:
    """Mean loss (and its parts) over n_batches per rank, averaged over ranks; the model is left in train mode."""
    import torch.distributed as dist

    engine.eval()
    total = torch.zeros((), dtype=torch.float64, device=engine.device)
    part_sums: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for i in range(n_batches):
            loss, parts = split_loss(loss_fn(engine, _to_device(eval_batches(i, rank, world), engine.device)))
            total += loss.double()
            _sum_parts(part_sums, parts)
    engine.train()
    names = sorted(part_sums)
    stats = torch.stack([total, *(part_sums[n].to(total.device) for n in names)])
    if world > 1:
        dist.all_reduce(stats)
    means = (stats / (n_batches * world)).tolist()
    return means[0], dict(zip(names, means[1:]))


# ----------------------------------------------------------------------------- one step and its reports


class LossSteps:
    """Pretraining's and SFT's step: grad_accum micro-batches of `loss_fn` through forward, backward and the
    engine step, with one all-reduce of the stats; validation is the mean loss over log.eval_batches batches."""

    def __init__(self, cfg: TrainingConfig, train_batches: BatchFn, eval_batches: BatchFn | None, loss_fn: LossFn,
                 batch_tokens: Callable[[Batch], int] | None = None) -> None:
        self.cfg, self.train_batches, self.eval_batches = cfg, train_batches, eval_batches
        self.loss_fn, self.batch_tokens = loss_fn, batch_tokens

    def step(self, engine, step: int, rank: int, world: int) -> StepStats:
        import torch.distributed as dist

        cfg, device = self.cfg, engine.device
        t0 = time.perf_counter()
        lr = float(engine.get_lr()[0])
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        nonfinite = torch.zeros((), dtype=torch.float64, device=device)
        fed = torch.zeros((), dtype=torch.float64, device=device)
        part_sums: dict[str, torch.Tensor] = {}
        for k in range(cfg.batch.grad_accum):
            batch = _to_device(self.train_batches(step * cfg.batch.grad_accum + k, rank, world), device)
            fed += self.batch_tokens(batch) if self.batch_tokens else cfg.batch.micro_batch_size * cfg.batch.seq_len
            loss, parts = split_loss(self.loss_fn(engine, batch))
            _sum_parts(part_sums, parts)
            if not loss.requires_grad:
                raise TypeError("loss_fn must return a scalar tensor attached to the model's graph (requires_grad)")
            detached = loss.detach().double()
            loss_sum += torch.nan_to_num(detached, nan=0.0, posinf=0.0, neginf=0.0)
            nonfinite += (~torch.isfinite(detached)).double()
            # A non-finite loss still goes through backward: its NaN gradients make DeepSpeed's
            # overflow check (or GuardedAdamW) skip the update on every rank, with no special path.
            engine.backward(loss)
            engine.step()
        names = sorted(part_sums)
        stats = torch.stack([loss_sum, nonfinite, fed, *(part_sums[n].to(device) for n in names)])
        if world > 1:
            dist.all_reduce(stats)
        n_nonfinite = int(stats[1].item())
        tokens = int(stats[2].item())  # summed over ranks by the same all_reduce
        bad = n_nonfinite > 0 or not engine.was_step_applied()
        per_step = cfg.batch.grad_accum * world
        loss_mean = None if bad else float(stats[0].item()) / per_step
        parts = {} if bad else {n: v / per_step for n, v in zip(names, stats[3:].tolist())}
        return StepStats(lr, loss_mean, n_nonfinite, tokens, time.perf_counter() - t0, parts)

    def validate(self, engine, rank: int, world: int) -> dict[str, float] | None:
        if self.eval_batches is None or self.cfg.log.eval_batches == 0:
            return None
        loss, parts = validation_losses(engine, self.eval_batches, self.loss_fn, self.cfg.log.eval_batches, rank, world)
        return {"val_loss": loss, "val_ppl": perplexity(loss), **{f"val_{name}": v for name, v in parts.items()}}

    def start(self, engine) -> dict[str, float] | None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass


