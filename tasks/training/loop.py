"""The one training loop: pretraining, SFT and GRPO all step, log, validate and checkpoint here.

    engine = build_engine(model, our AdamW groups, our LambdaLR, the stage's ds_config.json)
    resume from ckpt_dir's latest checkpoint (engine, RNG states, the loop's counters, the stage's own state)
    for step in range(resumed_step, cfg.steps):
        stats = steps.step(engine, step, data_rank, data_world)  # LossSteps: grad_accum micro-batches of loss_fn;
                                                                 # GRPO: rollouts, rewards, clipped updates;
                                                                 # pp > 1: PipelineSteps, engine.train_batch
        non-finite policy: a skipped step is counted; max_bad_steps in a row fail with the last good checkpoint
        log / validate / checkpoint on their schedules
        stopped (Ctrl-C, SIGTERM, a Prefect cancel)? checkpoint this step and stop (tasks/training/stop.py)

A stage supplies a `Steps` object (tasks/training/types.py): its step, its validation, the state a
checkpoint carries for it. `LossSteps` is pretraining's and SFT's: batches and a loss. Data order is a
pure function of (micro-batch index, rank, world), so resuming needs only the step count; the
checkpoint also carries each rank's RNG states so anything random continues exactly as in
an uninterrupted run. Every rank's entry point, which calls `fit`, is tasks/training/rank.py.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from models.bpb import bits_per_byte
from tasks.training.checkpoint import load_latest, save_checkpoint, seed_all, tag_of
from tasks.training.config import TrainingConfig
from tasks.training.distributed import data_group, init_distributed
from tasks.training.engine import build_engine
from tasks.training.metrics import MetricsSink, StepClock, perplexity
from tasks.training.parallel import RankLayout, memory_record
from tasks.training.progress import Progress, count_bad_step, log_window, on_schedule, throughput, validate
from tasks.training.stop import StopRequest, TrainingStopped
from tasks.training.types import Batch, BatchFn, BpbFn, Echo, LossFn, LossParts, Steps, StepStats, TrainResult


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
        dist.all_reduce(stats, group=data_group(engine))
    means = (stats / (n_batches * world)).tolist()
    return means[0], dict(zip(names, means[1:]))


def validation_bits_per_byte(engine, eval_batches: BatchFn, bpb_fn: BpbFn, n_batches: int, rank: int,
                             world: int) -> float:
    """Bits per byte over the same validation batches (models/bpb.py): nats and bytes summed on every rank."""
    engine.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=engine.device)
    with torch.no_grad():
        for i in range(n_batches):
            nats, n_bytes = bpb_fn(engine, _to_device(eval_batches(i, rank, world), engine.device))
            sums += torch.stack([nats.double(), n_bytes.double()])
    engine.train()
    if world > 1:
        dist.all_reduce(sums, group=data_group(engine))
    return bits_per_byte(float(sums[0]), int(sums[1]))


class LossSteps:
    """Pretraining's and SFT's step: grad_accum micro-batches of `loss_fn` through forward, backward and the
    engine step, with one all-reduce of the stats; validation is the mean loss over log.eval_batches batches,
    and, with `bpb_fn`, bits per byte over the same batches (comparable across tokenizers)."""

    updates_per_step = 1  # one optimizer step after grad_accum micro-batches

    def __init__(self, cfg: TrainingConfig, train_batches: BatchFn, eval_batches: BatchFn | None, loss_fn: LossFn,
                 batch_tokens: Callable[[Batch], int] | None = None, bpb_fn: BpbFn | None = None) -> None:
        self.cfg, self.train_batches, self.eval_batches = cfg, train_batches, eval_batches
        self.loss_fn, self.batch_tokens, self.bpb_fn = loss_fn, batch_tokens, bpb_fn

    def step(self, engine, step: int, rank: int, world: int) -> StepStats:
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
            dist.all_reduce(stats, group=data_group(engine))
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
        n = self.cfg.log.eval_batches
        loss, parts = validation_losses(engine, self.eval_batches, self.loss_fn, n, rank, world)
        metrics = {"val_loss": loss, "val_ppl": perplexity(loss), **{f"val_{name}": v for name, v in parts.items()}}
        if self.bpb_fn is not None:
            metrics["val_bpb"] = validation_bits_per_byte(engine, self.eval_batches, self.bpb_fn, n, rank, world)
        return metrics

    def start(self, engine) -> dict[str, float] | None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass


# ----------------------------------------------------------------------------- the loop


def fit(
    model: torch.nn.Module,
    cfg: TrainingConfig,
    steps: Steps,
    ckpt_dir: Path | None,
    log: MetricsSink,
    *,
    micro_batch_size: int,
    grad_accum: int,
    seq_len: int,
    flops_per_token: float | None = None,
    echo: Echo | None = None,
    ds_config: dict[str, Any] | None = None,
) -> TrainResult:
    """Train `model` with DeepSpeed until cfg.steps, resuming from ckpt_dir's latest checkpoint if any
    (no checkpoints when ckpt_dir is None). Rank 0 sends metrics to `log` and, when given, one line per
    log step to `echo`; the engine is built for micro-batches of `micro_batch_size` sequences of up to
    `seq_len` tokens, `grad_accum` to a step."""
    rank, world = init_distributed()
    # launch.dp x tp x pp: the batches are cut by data_rank and data_world; pp's step is engine.train_batch.
    layout = RankLayout.of(cfg.launch, rank, world)
    data_rank, data_world = layout.data_rank, layout.data_world
    if ckpt_dir is not None:
        ckpt_dir = Path(ckpt_dir)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    seed_all(cfg.seed + data_rank)
    steps = layout.steps(steps)
    engine = build_engine(layout.wrap(model, cfg.seed), cfg.optim, cfg.launch, micro_batch_size, grad_accum,
                          cfg.steps, ds_config, layout, steps.updates_per_step)
    client = load_latest(engine, ckpt_dir, rank, world, echo) if ckpt_dir is not None else {}
    progress = Progress.resumed(client, micro_batch_size * seq_len * grad_accum * data_world)
    if client:
        steps.load_state(client.get("stage") or {})
    start = progress.step
    progress.clock = StepClock(start, cfg.steps)
    if start and echo:
        echo(f"resuming from step {start} ({ckpt_dir / tag_of(start)}): training steps {start + 1}-{cfg.steps}")
    # After the resume: measuring the peak draws random matrices, so its place in the RNG streams stays here
    # (moved, it would change every random draw of the run after it).
    clock = throughput(model, cfg, seq_len, engine.device, rank, flops_per_token)
    checkpoint: Path | None = ckpt_dir / tag_of(start) if start and ckpt_dir is not None else None

    engine.train()
    if not start:
        started = steps.start(engine)
        if started and rank == 0:
            log.log_metrics(started, 0)
            progress.history.append({"step": 0.0, **started})
    def save(done: int) -> Path:
        state = {**progress.client_state(world), "stage": steps.state()}
        return save_checkpoint(engine, ckpt_dir, done, state, rank, world, cfg.checkpoint.keep)

    # A SIGINT/SIGTERM from here on ends the loop after its step, saved (tasks/training/stop.py).
    with StopRequest.installed() as stop:
        for step in range(start, cfg.steps):
            stats = steps.step(engine, step, data_rank, data_world)
            progress.step = done = step + 1
            progress.tokens_seen += stats.tokens
            clock.add(stats.seconds, stats.tokens, stats.loss, stats.parts)
            if stats.loss is None:
                count_bad_step(progress, stats, cfg, rank, log, echo, ckpt_dir)
            else:
                progress.bad_run = 0
                progress.last_loss = stats.loss
            if on_schedule(done, cfg.log.every, cfg.steps):
                if rank == 0 and clock.window_losses:
                    log_window(engine, progress, clock, stats, cfg, world, log, echo, getattr(steps, "echoed", None))
                clock.reset_window()
            if on_schedule(done, cfg.log.eval_every, cfg.steps):
                validate(engine, progress, steps, data_rank, data_world, log, echo)
            if ckpt_dir is not None and on_schedule(done, cfg.checkpoint.every, cfg.steps):
                checkpoint = save(done)
            signum = stop.agreed(world)
            if signum is not None:
                if ckpt_dir is not None and checkpoint != ckpt_dir / tag_of(done):
                    checkpoint = save(done)
                raise TrainingStopped(signum, done, checkpoint if ckpt_dir is not None else None)

    precision = "bf16" if engine.bfloat16_enabled() else "fp32"
    memory = memory_record(layout, cfg.launch.zero, getattr(model, "cfg", None), seq_len, micro_batch_size, precision,
                           world)
    return TrainResult(
        steps=max(start, cfg.steps),
        final_train_loss=progress.last_loss,
        final_val_loss=progress.last_val,
        final_val_ppl=perplexity(progress.last_val) if progress.last_val is not None else None,
        tokens_seen=progress.tokens_seen,
        train_tokens_per_s=clock.tokens_per_s(),
        skipped_steps=progress.skipped,
        resumed_from=start or None,
        world_size=world,
        checkpoint=checkpoint,
        history=progress.history,
        final_val_parts=progress.last_val_parts,
        final_val_bpb=progress.last_val_bpb,
        engine=engine,
        layout=layout,
        memory=memory,
    )
