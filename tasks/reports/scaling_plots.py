"""The scaling sweep's figures: IsoFLOP curves, the compute-optimal frontier, the fitted L(N, D) contours.

Same canvas and atomic writes as tasks/reports/plots.py. Every figure takes the measured points
and, when the sweep could be fitted, the bootstrap of its fits and the prediction.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from infra.workspace.atomic import write_figure_atomic
from models.scaling_bootstrap import ScalingBootstrap
from tasks.training.scaling.prediction import Prediction
from tasks.training.scaling.sweep import MeasuredPoint

CHINCHILLA_RATIO = 20.0  # tokens per parameter, drawn for reference only


def _finish(fig: Figure, ax: Any, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """A log-x figure's labels, grid and legend, saved to `path`."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return write_figure_atomic(fig, path)


def _budgets(points: Sequence[MeasuredPoint]) -> list[float]:
    return sorted({p.budget for p in points})


def isoflop_png(points: Sequence[MeasuredPoint], sb: ScalingBootstrap | None, path: Path) -> Path:
    """Bits per byte against N, one curve per budget, with approach 2's parabola and its minimum."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    minima = {m.compute: m for m in sb.isoflop.minima} if sb else {}
    colors = [f"C{i}" for i in range(10)]
    for i, budget in enumerate(_budgets(points)):
        at = sorted((p for p in points if p.budget == budget), key=lambda p: p.n_params)
        n = np.array([p.n_params for p in at], dtype=float)
        c = colors[i % 10]
        ax.plot(n, [p.final_val_bpb for p in at], "o", color=c, label=f"C = {budget:.2g} FLOPs")
        if budget in minima:
            grid = np.exp(np.linspace(math.log(n.min()), math.log(n.max()), 100))
            ax.plot(grid, minima[budget].parabola(grid), "-", color=c, alpha=0.6)
            ax.plot([minima[budget].n_params], [minima[budget].loss], "*", color=c, markersize=12)
    return _finish(fig, ax, path, "parameters N", "validation bits per byte",
                   "IsoFLOP curves (star: each budget's fitted minimum)")


def frontier_png(points: Sequence[MeasuredPoint], sb: ScalingBootstrap | None, prediction: Prediction | None,
                 path: Path) -> Path:
    """N_opt(C): each budget's minimum, approach 2's line, Chinchilla's 20 tokens/param, the predicted run."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    budgets = _budgets(points)
    top = prediction.budget if prediction else budgets[-1]
    grid = np.exp(np.linspace(math.log(budgets[0]) - 0.3, math.log(top) + 0.3, 50))
    ax.plot(grid, np.sqrt(grid / (6 * CHINCHILLA_RATIO)), ":", color="grey",
            label=f"Chinchilla: D = {CHINCHILLA_RATIO:g} N, C = 6 N D")
    ax.plot([p.budget for p in points], [p.n_params for p in points], ".", color="C7", label="swept runs")
    if sb:
        ax.plot([m.compute for m in sb.isoflop.minima], [m.n_params for m in sb.isoflop.minima], "o", color="C0",
                label="IsoFLOP minima")
        ax.plot(grid, [sb.isoflop.n_opt(c) for c in grid], "-", color="C0",
                label=f"approach 2: N_opt ~ C^{sb.isoflop.a:.2f}")
    if prediction:
        ax.plot([prediction.budget], [prediction.n_params], "*", color="C3", markersize=14,
                label=f"predicted run (depth {prediction.depth})")
    ax.set_yscale("log")
    return _finish(fig, ax, path, "training FLOPs C", "parameters N", "Compute-optimal model size")


def contours_png(points: Sequence[MeasuredPoint], sb: ScalingBootstrap, prediction: Prediction | None,
                 path: Path) -> Path:
    """Approach 3's L(N, D) as contours over the swept region, the runs on it, the predicted run."""
    fig = Figure(figsize=(7, 5))
    ax = fig.subplots()
    n = [p.n_params for p in points] + ([prediction.n_params] if prediction else [])
    d = [p.tokens for p in points] + ([prediction.tokens] if prediction else [])
    gn = np.exp(np.linspace(math.log(min(n)) - 0.5, math.log(max(n)) + 0.5, 120))
    gd = np.exp(np.linspace(math.log(min(d)) - 0.5, math.log(max(d)) + 0.5, 120))
    nn, dd = np.meshgrid(gn, gd)
    filled = ax.contourf(nn, dd, sb.law.loss(nn, dd), levels=20, cmap="viridis")
    fig.colorbar(filled, ax=ax, label="fitted bits per byte")
    sc = ax.scatter([p.n_params for p in points], [p.tokens for p in points], c=[p.final_val_bpb for p in points],
                    cmap="viridis", norm=filled.norm, edgecolors="white", label="swept runs (measured)")
    sc.set_zorder(3)
    if prediction:
        ax.plot([prediction.n_params], [prediction.tokens], "*", color="red", markersize=14, label="predicted run")
    ax.plot(gn, CHINCHILLA_RATIO * gn, ":", color="white", label=f"D = {CHINCHILLA_RATIO:g} N")
    ax.set_xlim(gn[0], gn[-1])
    ax.set_ylim(gd[0], gd[-1])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters N")
    ax.set_ylabel("training tokens D")
    ax.set_title(f"L(N, D) = {sb.law.E:.3f} + {sb.law.A:.3g}/N^{sb.law.alpha:.3f} + {sb.law.B:.3g}/D^{sb.law.beta:.3f}")
    ax.legend(fontsize=8, loc="lower left")
    return write_figure_atomic(fig, path)
