"""The one loop's bookkeeping: counters, the non-finite-loss policy, logging, validation, throughput and MFU.

Its counters are what a checkpoint carries besides the engine and the RNG states.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from infra.launch.launcher import resolve_precision
from infra.launch.precision import cpu_peak_flops
from tasks.training.config import TrainingConfig
from tasks.training.metrics import MetricsSink, StepClock, Throughput, measure_peak_flops, model_flops_per_token
from tasks.training.types import Echo, Steps, StepStats


class NonFiniteLossError(RuntimeError):
    """Training produced max_bad_steps non-finite losses in a row."""


@dataclass
class Progress:
    """The loop's counters: what a checkpoint carries besides the engine and the RNG states."""

    step: int = 0
    tokens_seen: int = 0
    skipped: int = 0
    bad_run: int = 0  # consecutive non-finite steps
    last_loss: float | None = None
    last_val: float | None = None
    last_val_bpb: float | None = None
    last_val_parts: dict[str, float] = field(default_factory=dict)
    # Carried in the checkpoint so a resumed run's loss curve starts at step 1, not at the resume.
    history: list[dict[str, float]] = field(default_factory=list)
    clock: StepClock | None = field(default=None, repr=False)  # this session's elapsed time and ETA

    @classmethod
    def resumed(cls, client: dict[str, Any], tokens_per_step: int) -> "Progress":
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
            last_val_bpb=client.get("last_val_bpb"),
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
            "last_val_bpb": self.last_val_bpb,
            "last_val_parts": self.last_val_parts,
            "history": self.history,
        }


def count_bad_step(progress: Progress, stats: StepStats, cfg: TrainingConfig, rank: int, log: MetricsSink,
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


def log_window(engine, progress: Progress, clock: Throughput, stats: StepStats, cfg: TrainingConfig, world: int,
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


def validate(engine, progress: Progress, steps: Steps, rank: int, world: int, log: MetricsSink,
              echo: Echo | None) -> None:
    """The stage's validation on every rank; rank 0 logs it at the current step."""
    done = progress.step
    metrics = steps.validate(engine, rank, world)
    if metrics is None:
        return
    progress.last_val = metrics.get("val_loss")
    progress.last_val_parts = {k[4:]: v for k, v in metrics.items() if k.startswith("val_") and k not in
                               ("val_loss", "val_ppl", "val_bpb")}
    progress.last_val_bpb = metrics.get("val_bpb")
    if rank == 0:
        log.log_metrics(metrics, done)
        progress.history.append({"step": float(done), **metrics})
        if echo:
            echo(f"step {done}: " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))


def on_schedule(done: int, every: int, last: int) -> bool:
    """Whether step `done` is a multiple of `every` (0: never) or the last step."""
    return done == last or bool(every and done % every == 0)


def throughput(model: torch.nn.Module, cfg: TrainingConfig, seq_len: int, device, rank: int,
                flops_per_token: float | None) -> Throughput:
    """FLOPs per token and (rank 0, when not configured) the measured peak FLOP/s that MFU divides by."""
    fpt = flops_per_token if flops_per_token is not None else model_flops_per_token(model, seq_len)
    peak, cpu_dtype = cfg.log.peak_flops, None
    if peak is None and rank == 0 and fpt is not None:
        dtype = torch.bfloat16 if resolve_precision(cfg.launch.precision) == "bf16" else torch.float32
        # The CPU's is measured once per machine (infra/launch/precision.py); a GPU's at each launch (a fraction of a second).
        if torch.device(device).type == "cpu":
            cpu_dtype = str(dtype).removeprefix("torch.")
            peak = cpu_peak_flops(cpu_dtype)
        else:
            peak = measure_peak_flops(device, dtype)
    return Throughput(flops_per_token=fpt, peak_flops=peak, cpu_peak_dtype=cpu_dtype)
