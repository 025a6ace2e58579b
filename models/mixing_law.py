"""Mixing laws: a target's loss as a function of the data mix, fitted on proxy runs, and the mix it predicts best.

    mixes = sample_mixes(catalog_weights, m, caps, floor, seed)           Dirichlet around the catalog's weights
    law = fit_mixing_law(mixes, bpb)                                       log-linear (Data Mixing Laws) -> MixingLaw
    choice = choose_model(mixes, bpb)                                      log-linear, or quadratic where LOO says so
    best = propose_mix(choice.model, caps, floor, span=proxy_span(mixes))  the weights the law predicts lowest
    lo, hi = prediction_interval(mixes, bpb, best, choice.name)            residual bootstrap: a new run's interval

The log-linear law is Ye et al. 2024's (arXiv:2403.16952), L(r) = c + k exp(sum_j t_j r_j), the default of olmix
too. On the simplex (shares summing to 1) k is not identifiable apart from the t_j (log k + t . r = (t + log k) . r),
so it is fitted as c + exp(t . r), by least squares from a grid of starts, with the offset c, the loss no mix goes
below, held in [0, the lowest loss measured]. The second
regressor is Scheffé's quadratic mixture model, sum_j b_j r_j + sum_{j<k} b_jk r_j r_k (no intercept and no squares:
on the simplex they are combinations of these terms), ridge-regularised: what RegMix's linear baseline grows into
when the effects interact. Whichever predicts a left-out proxy better (leave-one-out squared error) is used; both
models' leave-one-out Spearman correlations are reported, the chosen one's as the fit's: how well the law ranks
mixes it did not see (chosen on the same left-out predictions, so slightly optimistic).
The proposal minimises the prediction over the simplex with each source's share between `floor` and its cap
(the share its documents fill at `max_epochs` repeats), and, given a `span`, within each source's range among the
proxies: the law is trusted about where it was fitted (a box: with three or more sources its corners may lie
away from every proxy; RegMix searches the prior's whole support, olmix regularises toward the prior). By SLSQP
from several starts. All of it is numpy/scipy.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel
from scipy.optimize import least_squares, minimize
from scipy.stats import spearmanr

ModelName = Literal["log_linear", "quadratic"]


class MixModel(Protocol):
    def predict(self, mixes: np.ndarray) -> np.ndarray: ...


class MixingLaw(BaseModel):
    """L(r) = c + exp(t . r): a lower `t[j]` where more of source j lowers the loss."""

    c: float
    t: list[float]

    def predict(self, mixes: np.ndarray) -> np.ndarray:
        r = np.atleast_2d(np.asarray(mixes, dtype=np.float64))
        return self.c + np.exp(r @ np.asarray(self.t))


class QuadraticMix(BaseModel):
    """L(r) = w . phi(r), phi = (r_j, r_j r_k for j < k): Scheffé's quadratic mixture model."""

    w: list[float]

    def predict(self, mixes: np.ndarray) -> np.ndarray:
        return _features(np.atleast_2d(np.asarray(mixes, dtype=np.float64))) @ np.asarray(self.w)


class ModelChoice(BaseModel):
    name: ModelName
    model: MixingLaw | QuadraticMix
    loo_mse: dict[str, float]  # each candidate's leave-one-out squared error
    loo_spearman: float  # the chosen model's leave-one-out predictions against the measured, ranked
    loo_spearmans: dict[str, float]  # each candidate's
    loo_predictions: list[float]  # the chosen model's: each proxy's loss as predicted by the fit on the others


def _check(mixes: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, y = np.atleast_2d(np.asarray(mixes, dtype=np.float64)), np.asarray(loss, dtype=np.float64)
    if r.shape[0] != y.shape[0]:
        raise ValueError(f"{r.shape[0]} mixes against {y.shape[0]} losses")
    if r.shape[0] < r.shape[1] + 2:  # the law's c and t, and one more to check a fit on a left-out proxy
        raise ValueError(f"{r.shape[0]} proxies cannot fit a law over {r.shape[1]} sources: train at least "
                         f"{r.shape[1] + 2}")
    if not np.allclose(r.sum(axis=1), 1.0, atol=1e-6) or (r < -1e-12).any():
        raise ValueError("each mix is a point of the simplex: shares >= 0 that sum to 1")
    if not np.isfinite(y).all():
        raise ValueError("every proxy needs a finite loss")
    return r, y


def fit_mixing_law(mixes: Sequence[Sequence[float]], loss: Sequence[float], start: MixingLaw | None = None) -> MixingLaw:
    """The log-linear law fitted by least squares, c in [0, the lowest loss]: from `start` (a bootstrap's refit),
    else from a grid of offsets."""
    r, y = _check(np.asarray(mixes), np.asarray(loss))
    top = float(y.min())
    if top <= 0:
        raise ValueError(f"the log-linear law needs losses above 0 (lowest: {top})")
    offsets = [top * frac for frac in (0.0, 0.5, 0.9, 0.99)]
    starts = ([np.array([min(max(start.c, 0.0), top * 0.999), *start.t])] if start is not None else
              [np.concatenate([[c0], np.full(r.shape[1], math.log(float(np.mean(y - c0))))]) for c0 in offsets])
    bounds = ([0.0] + [-np.inf] * r.shape[1], [top] + [np.inf] * r.shape[1])
    best, best_cost = None, math.inf
    for x0 in starts:
        with np.errstate(over="ignore"):  # a step far off overflows; least squares steps back from it
            fit = least_squares(lambda p: p[0] + np.exp(r @ p[1:]) - y, x0, bounds=bounds, method="trf",
                                max_nfev=300)  # a law that does not fit stops early: LOO refits it often
        if fit.cost < best_cost:
            best, best_cost = fit.x, fit.cost
    return MixingLaw(c=float(best[0]), t=[float(v) for v in best[1:]])


def _features(r: np.ndarray) -> np.ndarray:
    n = r.shape[1]
    cross = [r[:, j] * r[:, k] for j in range(n) for k in range(j + 1, n)]
    return np.column_stack([r, *cross])


def terms(name: ModelName, sources: int) -> int:
    """The fitted parameters of a law over `sources`: c and t (log-linear), or Scheffé's n(n+1)/2 (quadratic)."""
    return sources + 1 if name == "log_linear" else sources * (sources + 1) // 2


def fit_quadratic(mixes: Sequence[Sequence[float]], loss: Sequence[float], ridge: float = 1e-3) -> QuadraticMix:
    r, y = _check(np.asarray(mixes), np.asarray(loss))
    x = _features(r)
    w = np.linalg.solve(x.T @ x + ridge * np.eye(x.shape[1]), x.T @ y)
    return QuadraticMix(w=[float(v) for v in w])


FITS = {"log_linear": fit_mixing_law, "quadratic": fit_quadratic}


def leave_one_out(mixes: np.ndarray, loss: np.ndarray, name: ModelName) -> np.ndarray:
    """Each proxy's loss as predicted by the law fitted on the others."""
    r, y = np.asarray(mixes, dtype=np.float64), np.asarray(loss, dtype=np.float64)
    out = np.empty(len(y))
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        out[i] = FITS[name](r[keep], y[keep]).predict(r[i])[0]
    return out


def choose_model(mixes: Sequence[Sequence[float]], loss: Sequence[float]) -> ModelChoice:
    """The log-linear law, unless the quadratic predicts left-out proxies better (it needs more proxies than its
    terms); the chosen one refitted on all proxies, with both models' leave-one-out Spearman."""
    r, y = _check(np.asarray(mixes), np.asarray(loss))
    names: list[ModelName] = ["log_linear"]
    if len(y) - 1 > terms("quadratic", r.shape[1]):
        names.append("quadratic")
    predictions = {n: leave_one_out(r, y, n) for n in names}
    mse = {n: float(np.mean((p - y) ** 2)) for n, p in predictions.items()}
    rho = {n: float(spearmanr(p, y).statistic) if np.ptp(y) > 0 else math.nan for n, p in predictions.items()}
    name = min(names, key=lambda n: mse[n])
    return ModelChoice(name=name, model=FITS[name](r, y), loo_mse=mse, loo_spearman=rho[name], loo_spearmans=rho,
                       loo_predictions=[float(v) for v in predictions[name]])


def sample_mixes(weights: Sequence[float], m: int, caps: Sequence[float] | None = None, floor: float = 0.0,
                 seed: int = 0, concentration: float = 5.0) -> np.ndarray:
    """`m` mixes drawn from a Dirichlet centred on `weights` (`concentration` x weights x sources as its
    parameters), each kept
    within [floor, cap] per source (a draw outside is drawn again); the catalog's own weights are not among them."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    caps_a = np.ones_like(w) if caps is None else np.asarray(caps, dtype=np.float64)
    if floor * len(w) > 1 or caps_a.sum() < 1:
        raise ValueError(f"no mix fits: floor {floor} x {len(w)} sources > 1, or the caps {caps_a.tolist()} sum < 1")
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for _ in range(1000 * m):
        r = rng.dirichlet(np.maximum(concentration * w * len(w), 1e-3))
        if (r >= floor).all() and (r <= caps_a + 1e-12).all():
            out.append(r)
            if len(out) == m:
                return np.stack(out)
    raise ValueError(f"drew {len(out)} of {m} mixes within the floor and caps; lower the floor or raise the caps")


def proxy_span(mixes: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Each source's lowest and highest share among the proxies: the box the law was fitted in."""
    r = np.atleast_2d(np.asarray(mixes, dtype=np.float64))
    return r.min(axis=0), r.max(axis=0)


def propose_mix(model: MixModel, caps: Sequence[float], floor: float = 0.0,
                span: tuple[Sequence[float], Sequence[float]] | None = None, starts: int = 16,
                seed: int = 0) -> np.ndarray:
    """The mix on the simplex, each share in [floor, cap] (and within `span`, the proxies' range of it, when given),
    with the lowest predicted loss (SLSQP from `starts`)."""
    caps_a = np.asarray(caps, dtype=np.float64)
    n = len(caps_a)
    low, high = np.full(n, float(floor)), np.minimum(1.0, caps_a)
    if span is not None:
        low, high = np.maximum(low, np.asarray(span[0])), np.minimum(high, np.asarray(span[1]))
    if (low > high + 1e-12).any() or low.sum() > 1 + 1e-9 or high.sum() < 1 - 1e-9:
        raise ValueError(f"no mix lies within the floor, the caps and the proxies' span: low {low.tolist()}, high "
                         f"{high.tolist()}")
    bounds = list(zip(low.tolist(), high.tolist()))
    rng = np.random.default_rng(seed)
    best, best_value = None, math.inf
    for i in range(starts):
        x0 = np.full(n, 1.0 / n) if i == 0 else rng.dirichlet(np.ones(n))
        x0 = np.clip(x0, low, high)
        x0 = x0 / x0.sum()
        done = minimize(lambda r: float(model.predict(r)[0]), x0, method="SLSQP", bounds=bounds,
                        constraints=[{"type": "eq", "fun": lambda r: r.sum() - 1.0}], options={"maxiter": 500})
        r = np.clip(done.x, low, high)
        r = r / r.sum()
        value = float(model.predict(r)[0])
        if done.success and value < best_value:
            best, best_value = r, value
    if best is None:
        raise ValueError("no mix satisfies the floor and the caps")
    return best


def prediction_interval(mixes: Sequence[Sequence[float]], loss: Sequence[float], at: Sequence[float],
                        name: ModelName, resamples: int = 500, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Where a new proxy at mix `at` should land: refits on the fitted values plus resampled residuals, each
    prediction plus one more resampled residual (the new run's own noise), percentile interval."""
    r, y = _check(np.asarray(mixes), np.asarray(loss))
    fitted = FITS[name](r, y)
    base = fitted.predict(r)
    residuals = y - base
    residuals = residuals - residuals.mean()
    scale = math.sqrt(len(y) / max(1, len(y) - terms(name, r.shape[1])))  # a fit's residuals understate the noise
    rng = np.random.default_rng(seed)
    draws = np.empty(resamples)
    point = np.asarray(at, dtype=np.float64)
    for b in range(resamples):
        y_b = base + scale * rng.choice(residuals, size=len(y), replace=True)
        refit = fit_mixing_law(r, y_b, start=fitted) if name == "log_linear" else FITS[name](r, y_b)
        draws[b] = refit.predict(point)[0] + scale * rng.choice(residuals)
    tail = (1 - level) / 2
    return float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))
