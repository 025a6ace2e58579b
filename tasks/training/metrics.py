"""What the training loop measures and where it sends it: metric sinks, throughput and MFU, perplexity, the ETA."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from infra.launch.precision import remeasure_cpu_peak
from infra.lifecycle.clock import clock_text, run_left_text
from infra.tracking.runs import log_metrics
from models.flops import flops_per_token, mfu


class MetricsSink(Protocol):
    """Where rank 0 sends metrics."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...


class ListSink:
    """Keeps every logged (step, metrics) pair in memory (tests, plots)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.records.append((step, dict(metrics)))

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, in logging order."""
        pairs = [(s, m[name]) for s, m in self.records if name in m]
        return [s for s, _ in pairs], [v for _, v in pairs]


class MlflowSink:
    """Logs to the active MLflow run (opened with infra.tracking.runs.stage_run); only rank 0 writes."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.rank != 0:
            return
        # MLflow rejects NaN/inf metric values on some stores; log_metrics leaves them out.
        log_metrics(metrics, step=step)


# ----------------------------------------------------------------------------- throughput and MFU


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                       n: int | None = None, min_seconds: float = 1.0) -> float:
    """FLOP/s of square matmuls (torch.mm) on `device`: the practical peak that MFU is quoted against."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up: thread pools, kernel selection
    sync()
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and reps >= 3:
            break
    return 2.0 * n**3 * reps / elapsed


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> float | None:
    """Training FLOPs per token of a models.llama Transformer (6 x parameters for another model with a cfg)."""
    mcfg = getattr(model, "cfg", None)
    if mcfg is None:
        return None
    try:
        return flops_per_token(mcfg, seq_len)
    except (ImportError, AttributeError, TypeError):
        return 6.0 * sum(p.numel() for p in model.parameters())


@dataclass
class Throughput:
    """Training time and tokens of this session (eval and checkpoints excluded), and of the current log window."""

    flops_per_token: float | None = None
    peak_flops: float | None = None  # per rank
    cpu_peak_dtype: str | None = None  # set when peak_flops is the CPU's kept figure (infra/launch/precision.py)
    seconds: float = 0.0
    tokens: int = 0
    window_seconds: float = 0.0
    window_tokens: int = 0
    window_losses: list[float] = field(default_factory=list)
    window_parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, seconds: float, tokens: int, loss: float | None, parts: dict[str, float] | None = None) -> None:
        """Count one optimizer step; `loss` is None for a skipped step, `parts` the loss's named parts."""
        self.seconds += seconds
        self.tokens += tokens
        self.window_seconds += seconds
        self.window_tokens += tokens
        if loss is not None:
            self.window_losses.append(loss)
        for name, value in (parts or {}).items():
            self.window_parts.setdefault(name, []).append(value)

    def window_metrics(self, world: int) -> dict[str, float]:
        """Mean loss, tokens/s and (when FLOPs and peak are known) MFU of the window."""
        tps = self.window_tokens / self.window_seconds if self.window_seconds > 0 else 0.0
        metrics = {"loss": sum(self.window_losses) / len(self.window_losses), "tokens_per_s": tps}
        if self.flops_per_token is not None and self.peak_flops:
            metrics["mfu"] = mfu(tps, self.flops_per_token, self.peak_flops * world)
            if metrics["mfu"] > 1 and self.cpu_peak_dtype:  # the kept peak was measured on a busy CPU
                self.peak_flops = remeasure_cpu_peak(self.cpu_peak_dtype, tps * self.flops_per_token / world)
                metrics["mfu"] = mfu(tps, self.flops_per_token, self.peak_flops * world)
        return metrics

    def window_parts_mean(self) -> dict[str, float]:
        """Mean of each named part of the loss over the window's steps."""
        return {name: sum(values) / len(values) for name, values in self.window_parts.items()}

    def reset_window(self) -> None:
        self.window_seconds, self.window_tokens, self.window_losses, self.window_parts = 0.0, 0, [], {}

    def tokens_per_s(self) -> float | None:
        """Session throughput; None before any step ran."""
        return self.tokens / self.seconds if self.seconds > 0 else None


# ----------------------------------------------------------------------------- loss


def perplexity(loss: float) -> float:
    """exp(loss), capped: exp overflows past ~709; an untrained model's perplexity is the vocab size, far below."""
    return math.exp(min(loss, 700.0))


class StepClock:
    """Elapsed time and ETA of a run of steps, measured over the steps this process trained."""

    def __init__(self, first_step: int, total: int):
        self.started, self.first_step, self.total = time.monotonic(), first_step, total

    def text(self, done: int) -> str:
        """"elapsed 1m05s, ETA 3m12s" after step `done` of `total`."""
        elapsed = time.monotonic() - self.started
        trained = done - self.first_step
        eta = elapsed / trained * (self.total - done) if trained > 0 else float("nan")
        if eta != eta:
            return f"elapsed {clock_text(elapsed)}, ETA ?"
        return f"elapsed {clock_text(elapsed)}, ETA {clock_text(eta)}{run_left_text(eta)}"

