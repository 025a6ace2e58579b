"""Is a variant better than the baseline beyond seed noise? Paired differences over seeds and target windows.

    per_window = np.array([[nats, bytes], ...])              one model's scores on a target's windows
    d = bpb_difference(variant_runs, baseline_runs)           runs: [seeds][windows][nats, bytes], paired by seed
    d.diff, d.ci, d.verdict                                   variant - baseline; "better" when lower bpb is better
    v = value_difference([0.61, 0.58, 0.60], [0.55, 0.57, 0.52], higher_is_better=True)   a metric per seed
    m = mean_bpb_difference(variant_runs, baseline_runs)       runs: [seeds]{target: [windows][nats, bytes]}, the
                                                              targets' bits per byte averaged with equal weights

Two sources of noise make two models' bits per byte differ when their data do not: the seed (initial weights
and data order) and which texts the target happens to hold. Seed i of the variant is paired with seed i of the
baseline (the same initial weights and order of windows where their data allow), so the difference per seed
d_i = bpb(variant_i) - bpb(baseline_i) leaves out what the two share; every model is scored on the same
windows, so the window noise is a resample of windows applied to both. The interval is

    mean(d) ± t(0.975, ν) · sqrt(var_seed + var_window)

with var_seed = s²(d_i) / S (the seeds' scatter, S - 1 degrees of freedom), var_window the variance of
mean(d) over bootstrap resamples of the windows (the same resample for every model), and ν = S - 1, the
conservative end of Welch-Satterthwaite (few seeds make it wide: with 3, t is about 4.3). With one
seed there is no seed term, and the verdict says so. A verdict is `better` or `worse` only when the interval
excludes 0.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel
from scipy import stats

from models.bpb import bits_per_byte as bpb_of_sums

LEVEL = 0.95
Verdict = Literal["better", "worse", "indistinguishable"]


class Difference(BaseModel):
    """A variant against the baseline on one target or metric."""

    diff: float  # variant - baseline
    ci: tuple[float, float]
    verdict: Verdict
    seeds: int
    windows: int | None = None  # the target's windows (None for a metric)
    seed_only: bool = False  # True: a metric compared over seeds alone
    note: str | None = None  # e.g. "one seed: the interval counts the windows' noise only"


def bits_per_byte(scores: np.ndarray) -> float:
    """Bits per byte of a model's [windows, (nats, bytes)] scores (models/bpb.py over their sums)."""
    return bpb_of_sums(float(scores[:, 0].sum()), int(scores[:, 1].sum()))


def verdict(ci: tuple[float, float], lower_is_better: bool) -> Verdict:
    """`better`/`worse` when the interval of variant - baseline excludes 0, else `indistinguishable`."""
    if ci[0] > 0:
        return "worse" if lower_is_better else "better"
    if ci[1] < 0:
        return "better" if lower_is_better else "worse"
    return "indistinguishable"


def _interval(mean: float, var_seed: float, dof_seed: int, var_other: float, level: float) -> tuple[float, float]:
    """mean ± t · sqrt(var_seed + var_other), t with the seeds' S - 1 degrees of freedom: the conservative end of
    Welch-Satterthwaite (whose ν only grows past S - 1 as the other term grows). With the ν of the sum, three seeds
    that happened to agree gave an interval narrower than the seeds alone support: an A/A check on 20 disjoint
    seed blocks said `worse` 3 times in 20 on one target, against 1 with S - 1 (BENCHMARKS.md "Ablations")."""
    total = var_seed + var_other
    if total <= 0:
        return mean, mean
    nu = math.inf if var_seed <= 0 or dof_seed < 1 else dof_seed
    q = stats.norm.ppf(0.5 + level / 2) if math.isinf(nu) else stats.t.ppf(0.5 + level / 2, nu)
    half = float(q) * math.sqrt(total)
    return mean - half, mean + half


def _seed_and_window(variant: Sequence[np.ndarray], baseline: Sequence[np.ndarray], rng: np.random.Generator,
                     resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per seed, variant - baseline bits per byte on one target, and that mean over seeds on `resamples` bootstrap
    resamples of the target's windows (the same resample for every model)."""
    if len(variant) != len(baseline) or not variant:
        raise ValueError(f"paired by seed: {len(variant)} variant run(s) against {len(baseline)} baseline run(s)")
    v, b = np.stack([np.asarray(x, dtype=np.float64) for x in variant]), np.stack([np.asarray(x, dtype=np.float64)
                                                                                  for x in baseline])
    if v.shape != b.shape or v.ndim != 3 or v.shape[2] != 2:
        raise ValueError(f"scores must be [seeds, windows, (nats, bytes)] on the same windows: {v.shape} vs {b.shape}")
    d = np.array([bits_per_byte(v[i]) - bits_per_byte(b[i]) for i in range(v.shape[0])])
    idx = rng.integers(0, v.shape[1], size=(resamples, v.shape[1]))
    # bpb over a resample of windows: the sums of nats and bytes over the drawn windows, for every seed at once.
    nats_v, bytes_v = v[:, idx, 0].sum(axis=2), v[:, idx, 1].sum(axis=2)
    nats_b, bytes_b = b[:, idx, 0].sum(axis=2), b[:, idx, 1].sum(axis=2)
    return d, (nats_v / bytes_v - nats_b / bytes_b).mean(axis=0) / math.log(2)


def bpb_difference(variant: Sequence[np.ndarray], baseline: Sequence[np.ndarray], resamples: int = 2000,
                   seed: int = 0, level: float = LEVEL) -> Difference:
    """Variant minus baseline bits per byte on one target: `variant[i]`, `baseline[i]` are seed i's
    [windows, (nats, bytes)] scores on the same windows (lower is better)."""
    return mean_bpb_difference([{"t": v} for v in variant], [{"t": b} for b in baseline], resamples, seed, level)


def mean_bpb_difference(variant: Sequence[Mapping[str, np.ndarray]], baseline: Sequence[Mapping[str, np.ndarray]],
                        resamples: int = 2000, seed: int = 0, level: float = LEVEL) -> Difference:
    """Variant minus baseline of the targets' bits per byte averaged with equal weights (`mean_bpb`): `variant[i]`
    maps each target to seed i's [windows, (nats, bytes)] scores. Each target's windows are resampled on their own;
    the seeds pair as in `bpb_difference`."""
    if len(variant) != len(baseline) or not variant:
        raise ValueError(f"paired by seed: {len(variant)} variant run(s) against {len(baseline)} baseline run(s)")
    targets = sorted(variant[0])
    if any(sorted(run) != targets for run in [*variant, *baseline]):
        raise ValueError(f"every run must be scored on the same targets {targets}")
    rng = np.random.default_rng(seed)
    per_target = [_seed_and_window([r[t] for r in variant], [r[t] for r in baseline], rng, resamples) for t in targets]
    d = np.mean([p[0] for p in per_target], axis=0)
    boot = np.mean([p[1] for p in per_target], axis=0)
    n_seeds = len(d)
    var_seed = float(d.var(ddof=1) / n_seeds) if n_seeds > 1 else 0.0
    ci = _interval(float(d.mean()), var_seed, n_seeds - 1, float(boot.var(ddof=1)), level)
    note = "one seed: the interval counts the windows' noise only" if n_seeds == 1 else None
    return Difference(diff=float(d.mean()), ci=ci, verdict=verdict(ci, lower_is_better=True), seeds=n_seeds,
                      windows=sum(len(variant[0][t]) for t in targets), note=note)


def mean_bpb(scores: Mapping[str, np.ndarray]) -> float:
    """The targets' bits per byte averaged with equal weights: one model's measure over several targets."""
    return float(np.mean([bits_per_byte(np.asarray(s)) for s in scores.values()]))


def value_difference(variant: Sequence[float], baseline: Sequence[float], higher_is_better: bool,
                     level: float = LEVEL) -> Difference:
    """Variant minus baseline of a metric measured once per seed (paired by seed): a t interval over the seeds."""
    if len(variant) != len(baseline) or not variant:
        raise ValueError(f"paired by seed: {len(variant)} variant value(s) against {len(baseline)} baseline value(s)")
    d = np.asarray(variant, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    missing = int(np.isnan(d).sum())  # a seed whose evaluation did not compute the metric (NaN) pairs with nothing
    d = d[~np.isnan(d)]
    if len(d) == 0:
        return Difference(diff=math.nan, ci=(math.nan, math.nan), verdict="indistinguishable", seeds=0,
                          seed_only=True, note=f"not computed on any seed pair ({missing})")
    left_out = f"{missing} seed pair(s) without the metric left out" if missing else None
    if len(d) == 1:
        return Difference(diff=float(d[0]), ci=(-math.inf, math.inf), verdict="indistinguishable", seeds=1,
                          seed_only=True, note=left_out or "one seed: no interval")
    ci = _interval(float(d.mean()), float(d.var(ddof=1) / len(d)), len(d) - 1, 0.0, level)
    return Difference(diff=float(d.mean()), ci=ci, verdict=verdict(ci, lower_is_better=not higher_is_better),
                      seeds=len(d), seed_only=True, note=left_out)
