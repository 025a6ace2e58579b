"""The generic DeepSpeed training loop shared by pretraining and SFT.

    engine = build_engine(model, our AdamW groups, our LambdaLR, JSON for the ZeRO stage)
    for step in range(resumed_step, max_steps):
        for each micro-batch: loss = loss_fn(engine, train_batches(micro, rank, world)); backward; step
        one all-reduce: mean loss (and its named parts) + "was any loss non-finite?"  -> skipped/failed steps agree
        log / validate / checkpoint on their schedules

Data order is a pure function of (micro-batch index, rank, world), so resuming needs only the
step count; the checkpoint also carries each rank's RNG states so anything random in the
model (dropout) or the loss continues exactly as in an uninterrupted run.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tasks.training.config import TrainingConfig
from infra.deepspeed_launch import resolve_precision
from tasks.training.checkpoint import load_latest, save_checkpoint, seed_all, tag_of
from tasks.training.engine import build_engine, init_distributed
from tasks.training.metrics import (

    MetricsSink,
    StepClock,
    Throughput,
    measure_peak_flops,
    model_flops_per_token,
    perplexity,
)

Batch = Any  # whatever train_batches returns and loss_fn understands; tensors inside are moved to the device
BatchFn = Callable[[int, int, int], Batch]  # (micro-batch index, rank, world size) -> batch
# A loss, or (loss, parts): named detached scalars, e.g. the loss of each data source in a mixed
# batch, averaged like the loss and logged beside it. Every micro-batch returns the same names.
LossParts = dict[str, torch.Tensor]
LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor | tuple[torch.Tensor, LossParts]]
Echo = Callable[[str], Any]


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



class NonFiniteLossError(RuntimeError):
    """Training produced max_bad_steps non-finite losses in a row."""


@dataclass
class TrainResult:
    """What a training run ended with; `history` holds every metrics record rank 0 logged."""

    steps: int
    final_loss: float | None
    final_val_loss: float | None
    final_val_ppl: float | None
    tokens_seen: int
    tokens_per_s: float | None  # training throughput of this session, eval and checkpoints excluded
    skipped_steps: int
    resumed_from: int | None  # the checkpoint step this session started from; None for a fresh run
    world_size: int
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)
    final_val_parts: dict[str, float] = field(default_factory=dict)  # the loss_fn's parts at the last validation


@dataclass
class _Progress:
    """The loop's counters: what a checkpoint carries besides the engine and the RNG states."""

    step: int = 0
    tokens_seen: int = 0
    skipped: int = 0
    bad_run: int = 0  # consecutive non-finite steps
    last_loss: float | None = None
    last_val: float | None = None
    last_val_parts: dict[str, float] = field(default_factory=dict)
    # Carried in the checkpoint so a resumed run's loss curve starts at step 1, not at the resume.
    history: list[dict[str, float]] = field(default_factory=list)
    clock: StepClock | None = field(default=None, repr=False)  # this session's elapsed time and ETA

    @classmethod
    def resumed(cls, client: dict[str, Any], tokens_per_step: int) -> "_Progress":
        if not client:
            return cls()
        step = int(client["step"])
        return cls(
            step=step,
            tokens_seen=int(client.get("tokens_seen", step * tokens_per_step)),
            skipped=int(client.get("skipped_steps", 0)),
            bad_run=int(client.get("consecutive_bad", 0)),
            last_loss=client.get("last_loss"),
            last_val=client.get("last_val_loss"),
            last_val_parts=dict(client.get("last_val_parts") or {}),
            history=list(client.get("history") or []),
        )

    def client_state(self, world: int) -> dict[str, Any]:
        return {
            "step": self.step,
            "world_size": world,
            "tokens_seen": self.tokens_seen,
            "skipped_steps": self.skipped,
            "consecutive_bad": self.bad_run,
            "last_loss": self.last_loss,
            "last_val_loss": self.last_val,
            "last_val_parts": self.last_val_parts,
            "history": self.history,
        }


@dataclass
class _StepStats:
    """One optimizer step, agreed on by every rank."""

    lr: float  # the lr this step used
    loss: float | None  # mean over micro-batches and ranks; None when the step was skipped
    n_nonfinite: int  # micro-batches (all ranks) with a non-finite loss
    tokens: int  # fed by all ranks
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # the loss's named parts, averaged like it; {} when skipped


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


def _optimizer_step(engine, cfg: TrainingConfig, train_batches: BatchFn, loss_fn: LossFn,
                    batch_tokens: Callable[[Batch], int] | None, step: int, rank: int, world: int) -> _StepStats:
    """grad_accum micro-batches through forward, backward and the engine step; one all-reduce of the stats."""
    import torch.distributed as dist

    device = engine.device
    t0 = time.perf_counter()
    lr = float(engine.get_lr()[0])
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    nonfinite = torch.zeros((), dtype=torch.float64, device=device)
    fed = torch.zeros((), dtype=torch.float64, device=device)
    part_sums: dict[str, torch.Tensor] = {}
    for k in range(cfg.batch.grad_accum):
        batch = _to_device(train_batches(step * cfg.batch.grad_accum + k, rank, world), device)
        fed += batch_tokens(batch) if batch_tokens else cfg.batch.micro_batch_size * cfg.batch.seq_len
        loss, parts = split_loss(loss_fn(engine, batch))
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
    loss_mean = None if bad else float(stats[0].item()) / (cfg.batch.grad_accum * world)
    parts = {} if bad else {n: v / (cfg.batch.grad_accum * world) for n, v in zip(names, stats[3:].tolist())}
    return _StepStats(lr, loss_mean, n_nonfinite, tokens, time.perf_counter() - t0, parts)


def _count_bad_step(progress: _Progress, stats: _StepStats, cfg: TrainingConfig, rank: int, log: MetricsSink,
                    echo: Echo | None, ckpt_dir: Path) -> None:
    """Count a skipped step; fail after cfg.max_bad_steps of them in a row."""
    progress.skipped += 1
    progress.bad_run += 1
    done = progress.step
    if rank == 0:
        log.log_metrics({"skipped_step": 1.0, "nonfinite_losses": float(stats.n_nonfinite)}, done)
        if echo:
            echo(f"step {done}: non-finite loss on {stats.n_nonfinite} micro-batch(es); update skipped "
                 f"({progress.bad_run}/{cfg.max_bad_steps} in a row)")
    if progress.bad_run >= cfg.max_bad_steps:
        raise NonFiniteLossError(
            f"{progress.bad_run} consecutive steps (up to step {done}) had a non-finite loss or gradient; "
            "lower lr, raise warmup_steps or check the data; the last good checkpoint is in "
            f"{ckpt_dir}"
        )


def _log_window(engine, progress: _Progress, clock: Throughput, stats: _StepStats, cfg: TrainingConfig, world: int,
                log: MetricsSink, echo: Echo | None) -> None:
    """Rank 0: mean loss (and its parts), lr, throughput, grad norm and MFU of the steps since the last log."""
    done = progress.step
    window = clock.window_metrics(world)
    parts = clock.window_parts_mean()
    grad_norm = engine.get_global_grad_norm()
    metrics = {"loss": window["loss"], **parts, "lr": stats.lr, "tokens_per_s": window["tokens_per_s"],
               "tokens_seen": float(progress.tokens_seen)}
    if grad_norm is not None and stats.loss is not None:
        metrics["grad_norm"] = float(grad_norm)
    if "mfu" in window:
        metrics["mfu"] = window["mfu"]
    log.log_metrics(metrics, done)
    progress.history.append({"step": float(done), **metrics})
    if echo:
        echo(f"step {done}/{cfg.steps} loss {metrics['loss']:.4f}"
             + "".join(f" {name} {value:.4f}" for name, value in parts.items()) + f" lr {stats.lr:.2e} "
             f"{metrics['tokens_per_s']:,.0f} tok/s" + (f" mfu {metrics['mfu']:.1%}" if "mfu" in metrics else "")
             + f" ({progress.clock.text(done)})")


def _validate(engine, progress: _Progress, eval_batches: BatchFn, loss_fn: LossFn, cfg: TrainingConfig, rank: int,
              world: int, log: MetricsSink, echo: Echo | None) -> None:
    """Validation loss (and its parts, as val_<name>) on every rank; rank 0 logs it with its perplexity."""
    done = progress.step
    progress.last_val, progress.last_val_parts = validation_losses(engine, eval_batches, loss_fn, cfg.log.eval_batches,
                                                                   rank, world)
    if rank == 0:
        parts = {f"val_{name}": value for name, value in progress.last_val_parts.items()}
        val_metrics = {"val_loss": progress.last_val, "val_ppl": perplexity(progress.last_val), **parts}
        log.log_metrics(val_metrics, done)
        progress.history.append({"step": float(done), **val_metrics})
        if echo:
            echo(f"step {done}: val_loss {progress.last_val:.4f} val_ppl {val_metrics['val_ppl']:.2f}"
                 + "".join(f" {name} {value:.4f}" for name, value in parts.items()))


def _on_schedule(done: int, every: int, last: int) -> bool:
    """Whether step `done` is a multiple of `every` (0: never) or the last step."""
    return done == last or bool(every and done % every == 0)


def _throughput(model: torch.nn.Module, cfg: TrainingConfig, device, rank: int,
                flops_per_token: float | None) -> Throughput:
    """FLOPs per token and (rank 0, when not configured) the measured peak FLOP/s that MFU divides by."""
    fpt = flops_per_token if flops_per_token is not None else model_flops_per_token(model, cfg.batch.seq_len)
    peak = cfg.log.peak_flops
    if peak is None and rank == 0 and fpt is not None:
        peak = measure_peak_flops(device, torch.bfloat16 if resolve_precision(cfg.launch.precision) == "bf16" else torch.float32)
    return Throughput(flops_per_token=fpt, peak_flops=peak)


# ----------------------------------------------------------------------------- the loop


def train(
    model: torch.nn.Module,
    cfg: TrainingConfig,
    train_batches: BatchFn,
    eval_batches: BatchFn | None,
    loss_fn: LossFn,
    ckpt_dir: Path,
    log: MetricsSink,
    *,
    flops_per_token: float | None = None,
    batch_tokens: Callable[[Batch], int] | None = None,
    echo: Echo | None = None,
    ds_config: dict[str, Any] | None = None,
) -> TrainResult:
    """Train `model` with DeepSpeed until cfg.steps, resuming from ckpt_dir's latest checkpoint if any.

    `train_batches(i, rank, world)` returns micro-batch i (= step * grad_accum + k) of this rank;
    it must be a pure function of its arguments (and the seed it was built with) for resumes
    to be exact. `loss_fn(engine, batch)` returns a scalar loss, or (loss, named parts) whose
    means are logged beside the loss (as val_<name> on validation). Rank 0 sends metrics to
    `log` and, when given, one line per log step to `echo`. `batch_tokens(batch)` counts the tokens a
    micro-batch really feeds the model, for tokens/s and MFU when batches are padded per batch
    and shorter than seq_len (SFT); without it every micro-batch counts micro_batch_size * seq_len.
    """
    rank, world = init_distributed()
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    seed_all(cfg.seed + rank)
    engine = build_engine(model, cfg.optim, cfg.launch, cfg.batch.micro_batch_size, cfg.batch.grad_accum, cfg.steps,
                          ds_config)
    progress = _Progress.resumed(load_latest(engine, ckpt_dir, rank, world, echo), cfg.batch.tokens_per_step(world))
    start = progress.step
    progress.clock = StepClock(start, cfg.steps)
    if start and echo:
        echo(f"resuming from step {start} ({ckpt_dir / tag_of(start)}): training steps {start + 1}-{cfg.steps}")
    # After the resume: measuring the peak draws random matrices, as it always has at this point.
    clock = _throughput(model, cfg, engine.device, rank, flops_per_token)
    checkpoint: Path | None = ckpt_dir / tag_of(start) if start else None

    engine.train()
    for step in range(start, cfg.steps):
        stats = _optimizer_step(engine, cfg, train_batches, loss_fn, batch_tokens, step, rank, world)
        progress.step = done = step + 1
        progress.tokens_seen += stats.tokens
        clock.add(stats.seconds, stats.tokens, stats.loss, stats.parts)
        if stats.loss is None:
            _count_bad_step(progress, stats, cfg, rank, log, echo, ckpt_dir)
        else:
            progress.bad_run = 0
            progress.last_loss = stats.loss
        if _on_schedule(done, cfg.log.every, cfg.steps):
            if rank == 0 and clock.window_losses:
                _log_window(engine, progress, clock, stats, cfg, world, log, echo)
            clock.reset_window()
        if _on_schedule(done, cfg.log.eval_every, cfg.steps) and eval_batches is not None and cfg.log.eval_batches > 0:
            _validate(engine, progress, eval_batches, loss_fn, cfg, rank, world, log, echo)
        if _on_schedule(done, cfg.checkpoint.every, cfg.steps):
            checkpoint = save_checkpoint(engine, ckpt_dir, done, progress.client_state(world), rank, world,
                                         cfg.checkpoint.keep)

    return TrainResult(
        steps=max(start, cfg.steps),
        final_loss=progress.last_loss,
        final_val_loss=progress.last_val,
        final_val_ppl=perplexity(progress.last_val) if progress.last_val is not None else None,
        tokens_seen=progress.tokens_seen,
        tokens_per_s=clock.tokens_per_s(),
        skipped_steps=progress.skipped,
        resumed_from=start or None,
        world_size=world,
        checkpoint=checkpoint,
        history=progress.history,
        final_val_parts=progress.last_val_parts,
    )
