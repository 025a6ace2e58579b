"""The one training loop: pretraining, SFT and GRPO all step, log, validate and checkpoint here.

    engine = build_engine(model, our AdamW groups, our LambdaLR, the stage's ds_config.json)
    resume from ckpt_dir's latest checkpoint (engine, RNG states, the loop's counters, the stage's own state)
    for step in range(resumed_step, cfg.steps):
        stats = steps.step(engine, step, rank, world)      # LossSteps: grad_accum micro-batches of loss_fn;
                                                           # GRPO: rollouts, rewards, clipped updates
        non-finite policy: a skipped step is counted; max_bad_steps in a row fail with the last good checkpoint
        log / validate / checkpoint on their schedules

A stage supplies a `Steps` object: its step, its validation, the state a checkpoint carries
for it. `train` is the pretraining/SFT form (batches and a loss). Data order is a pure
function of (micro-batch index, rank, world), so resuming needs only the step count; the
checkpoint also carries each rank's RNG states so anything random continues exactly as in
an uninterrupted run.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
    engine: Any = field(default=None, repr=False)  # the trained engine (its .module is the model)


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
class StepStats:
    """One optimizer step, agreed on by every rank."""

    lr: float  # the lr this step used
    loss: float | None  # mean over micro-batches and ranks; None when the step was skipped
    n_nonfinite: int  # micro-batches (all ranks) with a non-finite loss
    tokens: int  # fed by all ranks
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # the loss's named parts, averaged like it; {} when skipped


class Steps(Protocol):
    """What a stage gives the loop: its optimizer step, its validation, and its own checkpoint state.

    An `echoed` attribute (names of the step's parts) limits what the progress line shows; without one
    it shows every part (the loss's parts, e.g. SFT's sft_loss and replay_loss).
    """

    def step(self, engine, step: int, rank: int, world: int) -> StepStats: ...

    def validate(self, engine, rank: int, world: int) -> dict[str, float] | None:
        """Validation metrics (`val_loss` among them when there is one); None: nothing to validate."""

    def start(self, engine) -> dict[str, float] | None:
        """Before the first step of a fresh run: metrics logged at step 0 (GRPO scores the starting policy)."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint carries for the stage besides the engine, the RNG and the loop's counters."""

    def load_state(self, state: dict[str, Any]) -> None: ...


def _count_bad_step(progress: _Progress, stats: StepStats, cfg: TrainingConfig, rank: int, log: MetricsSink,
                    echo: Echo | None, ckpt_dir: Path | None) -> None:
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
            "lower optim.lr, raise optim.warmup_steps or check the data; the last good checkpoint is in "
            f"{ckpt_dir}"
        )


def _log_window(engine, progress: _Progress, clock: Throughput, stats: StepStats, cfg: TrainingConfig, world: int,
                log: MetricsSink, echo: Echo | None, echoed: tuple[str, ...] | None) -> None:
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
        shown = {name: value for name, value in parts.items() if echoed is None or name in echoed}
        echo(f"step {done}/{cfg.steps} loss {metrics['loss']:.4f}"
             + "".join(f" {name} {value:.4f}" for name, value in shown.items()) + f" lr {stats.lr:.2e} "
             f"{metrics['tokens_per_s']:,.0f} tok/s" + (f" mfu {metrics['mfu']:.1%}" if "mfu" in metrics else "")
             + f" ({progress.clock.text(done)})")


def _validate(engine, progress: _Progress, steps: Steps, rank: int, world: int, log: MetricsSink,
              echo: Echo | None) -> None:
    """The stage's validation on every rank; rank 0 logs it at the current step."""
    done = progress.step
    metrics = steps.validate(engine, rank, world)
    if metrics is None:
        return
    progress.last_val = metrics.get("val_loss")
    progress.last_val_parts = {k[4:]: v for k, v in metrics.items() if k.startswith("val_") and k not in
                               ("val_loss", "val_ppl")}
    if rank == 0:
        log.log_metrics(metrics, done)
        progress.history.append({"step": float(done), **metrics})
        if echo:
            echo(f"step {done}: " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))


def _on_schedule(done: int, every: int, last: int) -> bool:
    """Whether step `done` is a multiple of `every` (0: never) or the last step."""
    return done == last or bool(every and done % every == 0)


def _throughput(model: torch.nn.Module, cfg: TrainingConfig, seq_len: int, device, rank: int,
                flops_per_token: float | None) -> Throughput:
    """FLOPs per token and (rank 0, when not configured) the measured peak FLOP/s that MFU divides by."""
    fpt = flops_per_token if flops_per_token is not None else model_flops_per_token(model, seq_len)
    peak = cfg.log.peak_flops
    if peak is None and rank == 0 and fpt is not None:
        peak = measure_peak_flops(device, torch.bfloat16 if resolve_precision(cfg.launch.precision) == "bf16" else torch.float32)
    return Throughput(flops_per_token=fpt, peak_flops=peak)


# ----------------------------------------------------------------------------- the loop


def train(model: torch.nn.Module, cfg: TrainingConfig, train_batches: BatchFn, eval_batches: BatchFn | None,
          loss_fn: LossFn, ckpt_dir: Path | None, log: MetricsSink, *, batch_tokens: Callable[[Batch], int] | None = None,
          **kw: Any) -> TrainResult:
    """Pretraining's and SFT's form of `fit`: `train_batches(i, rank, world)` returns micro-batch i
    (= step * grad_accum + k) of this rank, a pure function of its arguments (and the seed it was built
    with) for resumes to be exact; `loss_fn(engine, batch)` returns a scalar loss, or (loss, named parts)
    whose means are logged beside the loss (as val_<name> on validation). `batch_tokens(batch)` counts the
    tokens a micro-batch really feeds the model (SFT pads per batch); without it every micro-batch counts
    micro_batch_size * seq_len."""
    from tasks.training.loss_steps import LossSteps

    steps = LossSteps(cfg, train_batches, eval_batches, loss_fn, batch_tokens)
    b = cfg.batch
    return fit(model, cfg, steps, ckpt_dir, log, micro_batch_size=b.micro_batch_size, grad_accum=b.grad_accum,
               seq_len=b.seq_len, **kw)


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
    if ckpt_dir is not None:
        ckpt_dir = Path(ckpt_dir)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    seed_all(cfg.seed + rank)
    engine = build_engine(model, cfg.optim, cfg.launch, micro_batch_size, grad_accum, cfg.steps, ds_config)
    client = load_latest(engine, ckpt_dir, rank, world, echo) if ckpt_dir is not None else {}
    progress = _Progress.resumed(client, micro_batch_size * seq_len * grad_accum * world)
    steps.load_state(client.get("stage") or {}) if client else None
    start = progress.step
    progress.clock = StepClock(start, cfg.steps)
    if start and echo:
        echo(f"resuming from step {start} ({ckpt_dir / tag_of(start)}): training steps {start + 1}-{cfg.steps}")
    # After the resume: measuring the peak draws random matrices, as it always has at this point.
    clock = _throughput(model, cfg, seq_len, engine.device, rank, flops_per_token)
    checkpoint: Path | None = ckpt_dir / tag_of(start) if start and ckpt_dir is not None else None

    engine.train()
    if not start:
        started = steps.start(engine)
        if started and rank == 0:
            log.log_metrics(started, 0)
            progress.history.append({"step": 0.0, **started})
    for step in range(start, cfg.steps):
        stats = steps.step(engine, step, rank, world)
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
                _log_window(engine, progress, clock, stats, cfg, world, log, echo, getattr(steps, "echoed", None))
            clock.reset_window()
        if _on_schedule(done, cfg.log.eval_every, cfg.steps):
            _validate(engine, progress, steps, rank, world, log, echo)
        if ckpt_dir is not None and _on_schedule(done, cfg.checkpoint.every, cfg.steps):
            state = {**progress.client_state(world), "stage": steps.state()}
            checkpoint = save_checkpoint(engine, ckpt_dir, done, state, rank, world, cfg.checkpoint.keep)

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
        engine=engine,
    )
