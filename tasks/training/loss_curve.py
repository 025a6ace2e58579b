"""The loss curve of a training run as a PNG: one line per named series against the step.

Rank 0 draws it from a finished run's history (`loss_curve`); the report card draws GRPO's reward
curve with the same `loss_curve_png`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from infra.workspace.atomic import write_figure_atomic
from tasks.training.types import TrainResult


def loss_curve(result: TrainResult, path: Path, title: str) -> Path | None:
    """Plot the train and validation losses of a finished run; None when nothing was logged."""
    train = [(h["step"], h["loss"]) for h in result.history if "loss" in h]
    val = [(h["step"], h["val_loss"]) for h in result.history if "val_loss" in h]
    series = {name: pts for name, pts in (("train loss", train), ("val loss", val)) if pts}
    # Named parts of the loss (e.g. SFT's sft_loss and replay_loss, and their val_ twins) as their own lines.
    parts = sorted({k for h in result.history for k in h if k.endswith("_loss") and k not in ("loss", "val_loss")})
    for name in parts:
        series[name.replace("_", " ")] = [(h["step"], h[name]) for h in result.history if name in h]
    if not series:
        return None
    return loss_curve_png(
        {name: [s for s, _ in pts] for name, pts in series.items()},
        {name: [v for _, v in pts] for name, pts in series.items()},
        path,
        title=title,
    )


def loss_curve_png(
    steps: Sequence[float] | Mapping[str, Sequence[float]],
    values_by_name: Mapping[str, Sequence[float]],
    path: Path,
    title: str = "Loss",
    log_y: bool = False,
) -> Path:
    """One line per named series; `steps` is shared, or a mapping with each series' own steps."""
    if not values_by_name:
        raise ValueError("loss_curve_png needs at least one series in values_by_name; got none")
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for name, values in values_by_name.items():
        xs = steps[name] if isinstance(steps, Mapping) else steps
        if len(xs) != len(values):
            raise ValueError(f"series '{name}' has {len(values)} values but {len(xs)} steps; pass matching lengths")
        y = np.asarray(values, dtype=float)
        ax.plot(np.asarray(xs, dtype=float), y, label=name, marker="." if len(y) < 30 else None)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return write_figure_atomic(fig, path)
