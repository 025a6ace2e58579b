"""Scaling laws fitted to a sweep of training runs (Hoffmann et al. 2022, "Chinchilla").

    fit_isoflop_profiles(compute, n_params, loss, flops_per_token=six_n)   approach 2 -> IsoFlopFit
    fit_loss_law(n_params, tokens, loss)                                    approach 3 -> LossLaw
    law.optimum(compute)                                                    N*, D* under C = 6 N D

Their intervals and the loss predictions are in models/scaling_bootstrap.py.

Approach 2 (IsoFLOP profiles): at each compute budget C the runs trade size N against tokens
D; the loss against log N is close to a parabola whose minimum is N_opt(C). Its partner is
D_opt(C) = C / flops_per_token(N_opt): the caller says how a run's FLOPs were counted
(`six_n` is Chinchilla's C = 6 N D; a model family's exact count is another choice).
Then N_opt = k_N C^a and D_opt = k_D C^b are straight lines in log-log.

Approach 3 (parametric loss): L(N, D) = E + A / N^alpha + B / D^beta, fitted as in the
paper: log L-hat = LSE(a - alpha log N, b - beta log D, e) with A = e^a, B = e^b, E = e^e,
the Huber loss (delta = 1e-3) of its residual against log L, L-BFGS from a grid of starts.
Under C = 6 N D its minimum has a closed form (`LossLaw.optimum`).

Chinchilla's own numbers: the approach-3 constants printed in Hoffmann et al. (E=1.69, A=406.4,
B=410.7, alpha=0.34, beta=0.28) put the optimum at Gopher's 5.76e23 FLOPs near 32B parameters on
3.0T tokens, not at Chinchilla's 70B on 1.4T (which the paper sized from approaches 1 and 2).
Besiroglu et al. 2024 (arXiv:2404.10102) refit approach 3 to runs reconstructed from the paper's
plots (E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658); with those the closed form lands
within 10% of 70B / 1.4T. tests/unit/models/test_scaling.py pins both, with where the figures came from.

Loss is whatever unit the caller measured (nats per token, bits per byte): the law's form
holds in either, and every number comes back in the same unit. All of it is numpy/scipy.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel
from scipy.optimize import minimize
from threadpoolctl import ThreadpoolController

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, section 3.3

FlopsPerToken = Callable[[float], float]


def six_n(n_params: float) -> float:
    """Training FLOPs per token under Chinchilla's C = 6 N D."""
    return 6.0 * n_params


# ----------------------------------------------------------------------------- inputs


def _positive(name: str, values, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}]={arr[i]} must be positive and finite ({what}); fix or drop that run")
    return arr


def _same_length(**arrays: np.ndarray) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"one value per run is needed in each of {sorted(lengths)}; got lengths {lengths}")


# ----------------------------------------------------------------------------- approach 2


class IsoFlopMinimum(BaseModel):
    """The vertex of one budget's parabola of loss against ln N."""

    compute: float
    n_params: float  # N_opt(C)
    tokens: float  # D_opt(C) = C / flops_per_token(N_opt)
    loss: float  # the parabola at its vertex
    curvature: float  # coefficient of (ln N)^2; > 0 for a minimum

    def parabola(self, n_params):
        """The fitted parabola at N: loss + curvature * ln(N / N_opt)^2."""
        return self.loss + self.curvature * np.log(np.asarray(n_params) / self.n_params) ** 2


class IsoFlopFit(BaseModel):
    """Chinchilla approach 2: N_opt = exp(log_k_n) C^a and D_opt = exp(log_k_d) C^b."""

    minima: list[IsoFlopMinimum]
    a: float
    b: float
    log_k_n: float
    log_k_d: float

    def n_opt(self, compute: float) -> float:
        return math.exp(self.log_k_n + self.a * math.log(compute))

    def tokens_opt(self, compute: float) -> float:
        return math.exp(self.log_k_d + self.b * math.log(compute))


def _isoflop_minimum(compute: float, n_params: np.ndarray, loss: np.ndarray,
                     flops_per_token: FlopsPerToken) -> IsoFlopMinimum:
    x = np.log(n_params)
    center = x.mean()  # a centred abscissa keeps the 3x3 normal equations well conditioned
    c2, c1, c0 = np.polyfit(x - center, loss, 2)
    sizes = ", ".join(f"{n:.3g}" for n in np.unique(n_params))
    if c2 <= 0:
        raise ValueError(
            f"budget C={compute:.3g}: loss against log N opens downward, so its sizes N=[{sizes}] do not bracket "
            "the minimum; add sizes on both sides of the lowest loss at this budget"
        )
    vertex = -c1 / (2 * c2)
    if not x.min() <= vertex + center <= x.max():
        raise ValueError(
            f"budget C={compute:.3g}: the parabola's minimum N={math.exp(vertex + center):.3g} lies outside its sizes "
            f"N=[{sizes}]; add sizes beyond it so the minimum is bracketed rather than extrapolated"
        )
    n_opt = math.exp(vertex + center)
    return IsoFlopMinimum(compute=compute, n_params=n_opt, tokens=compute / flops_per_token(n_opt),
                          loss=float(c0 - c1 * c1 / (4 * c2)), curvature=float(c2))


def fit_isoflop_profiles(compute, n_params, loss, *, flops_per_token: FlopsPerToken) -> IsoFlopFit:
    """Chinchilla approach 2 over runs grouped by their (exactly equal) compute budget.

    flops_per_token(N) turns each budget's N_opt into D_opt = C / flops_per_token(N_opt); pass
    `six_n` for Chinchilla's C = 6 N D. Needs at least 2 budgets with at least 3 sizes each.
    """
    c = _positive("compute", compute, "training FLOPs of the run")
    n = _positive("n_params", n_params, "parameters of the run")
    y = _positive("loss", loss, "final validation loss of the run")
    _same_length(compute=c, n_params=n, loss=y)
    budgets = np.unique(c)
    sizes = {float(b): len(np.unique(n[c == b])) for b in budgets}
    short = {f"{b:.3g}": k for b, k in sizes.items() if k < 3}
    if len(budgets) < 2 or short:
        raise ValueError(
            f"approach 2 needs at least 2 budgets with at least 3 distinct sizes each; got sizes per budget "
            f"{ {f'{b:.3g}': k for b, k in sizes.items()} }: add budgets or sizes"
        )
    minima = [_isoflop_minimum(float(b), n[c == b], y[c == b], flops_per_token) for b in budgets]
    log_c = np.log([m.compute for m in minima])
    a, log_k_n = np.polyfit(log_c, np.log([m.n_params for m in minima]), 1)
    b, log_k_d = np.polyfit(log_c, np.log([m.tokens for m in minima]), 1)
    return IsoFlopFit(minima=minima, a=float(a), b=float(b), log_k_n=float(log_k_n), log_k_d=float(log_k_d))


# ----------------------------------------------------------------------------- approach 3


class ComputeOptimum(BaseModel):
    """The (N, D) that minimise a LossLaw at C = 6 N D, and the loss there."""

    compute: float
    n_params: float
    tokens: float
    tokens_per_param: float
    loss: float


class LossLaw(BaseModel):
    """L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n_params, tokens):
        """The law at (N, D); arrays broadcast."""
        return self.E + self.A / np.power(n_params, self.alpha) + self.B / np.power(tokens, self.beta)

    def optimum(self, compute: float) -> ComputeOptimum:
        """Minimum of the law on C = 6 N D (Hoffmann et al. eq. 4).

        G = (alpha A / (beta B))^(1 / (alpha + beta)),
        N_opt = G (C/6)^(beta / (alpha + beta)),  D_opt = G^-1 (C/6)^(alpha / (alpha + beta)).
        """
        if not compute > 0:
            raise ValueError(f"compute={compute} must be positive (training FLOPs of the budget)")
        if not (self.alpha > 0 and self.beta > 0 and self.A > 0 and self.B > 0):
            raise ValueError(
                f"a law with alpha={self.alpha:.3g}, beta={self.beta:.3g}, A={self.A:.3g}, B={self.B:.3g} does not fall "
                "with both N and D, so it has no compute-optimal point: check the runs it was fitted to"
            )
        s = self.alpha + self.beta
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / s)
        n = g * (compute / 6.0) ** (self.beta / s)
        d = (compute / 6.0) ** (self.alpha / s) / g
        return ComputeOptimum(compute=compute, n_params=n, tokens=d, tokens_per_param=d / n,
                              loss=float(self.loss(n, d)))


# Hoffmann et al.'s grid of starts, in the log-sum-exp parameters (a, b, e, alpha, beta).
_GRID = np.array(list(itertools.product(
    np.arange(0.0, 26.0, 5.0), np.arange(0.0, 26.0, 5.0), np.arange(-1.0, 1.01, 0.5),
    np.arange(0.0, 2.01, 0.5), np.arange(0.0, 2.01, 0.5),
)))
_STARTS = 4  # L-BFGS runs from the best grid points only: all 4500 would take minutes per fit


def _huber_objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray):
    """Mean Huber loss / delta of the log residuals, and its gradient; theta is [..., 5] (a, b, e, alpha, beta).

    Dividing by delta leaves the minimiser unchanged but keeps the objective of order |r| / delta
    instead of |r|, far below L-BFGS's stopping tolerances (Besiroglu et al. 2024 trace Hoffmann
    et al.'s own estimates to a search that stopped early for that reason).
    """
    a, b, e, alpha, beta = (theta[..., i, None] for i in range(5))
    t1, t2 = a - alpha * log_n, b - beta * log_d
    top = np.maximum(np.maximum(t1, t2), e)
    x1, x2, x3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(e - top)
    total = x1 + x2 + x3
    r = top + np.log(total) - log_l  # log L-hat - log L
    quadratic = np.abs(r) <= HUBER_DELTA
    value = np.where(quadratic, 0.5 * r * r / HUBER_DELTA, np.abs(r) - 0.5 * HUBER_DELTA).mean(axis=-1)
    g = np.where(quadratic, r / HUBER_DELTA, np.sign(r)) / (r.shape[-1] * total)  # d value / d term, over x_i
    g1, g2 = g * x1, g * x2
    grad = np.stack([g1.sum(-1), g2.sum(-1), (g * x3).sum(-1), -(g1 * log_n).sum(-1), -(g2 * log_d).sum(-1)], -1)
    return value, grad


# OpenBLAS hands even L-BFGS-B's 5x5 LAPACK calls to its threads, and on a busy machine the
# hand-off costs far more than the work; a bootstrap makes tens of thousands of them. One
# controller, made once: finding the BLAS libraries again on every fit costs more than the fit.
_BLAS = ThreadpoolController()


def _lbfgs(start: np.ndarray, data) -> tuple[float, np.ndarray]:
    res = minimize(_huber_objective, start, args=data, jac=True, method="L-BFGS-B",
                   options=dict(maxiter=2000, ftol=1e-14, gtol=1e-10))
    return float(res.fun), res.x


def _law(theta: np.ndarray) -> LossLaw:
    a, b, e, alpha, beta = (float(v) for v in theta)
    if not np.all(np.isfinite(theta)) or max(a, b, e) > 700:  # exp() past ~709 overflows a float
        raise ValueError(f"approach 3 diverged (ln A, ln B, ln E = {a:.3g}, {b:.3g}, {e:.3g}): these runs do not "
                         "pin the law down; add sizes or token counts")
    return LossLaw(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)


def _theta(law: LossLaw) -> np.ndarray:
    return np.array([math.log(law.A), math.log(law.B), math.log(law.E), law.alpha, law.beta])


def _fit_theta(n: np.ndarray, d: np.ndarray, y: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The best L-BFGS end point over `starts` (rows of (a, b, e, alpha, beta)).

    The search runs on ln N and ln D less their means, (a, b) shifted to match: the same
    minimiser, but a and alpha (b and beta) are no longer nearly collinear, so L-BFGS needs a
    fraction of the steps.
    """
    log_n, log_d = np.log(n), np.log(d)
    shift = np.array([log_n.mean(), log_d.mean()])
    data = (log_n - shift[0], log_d - shift[1], np.log(y))
    centred = starts.copy()
    centred[:, :2] -= centred[:, 3:5] * shift
    best = min((_lbfgs(s, data) for s in centred), key=lambda fx: fx[0])[1]
    best[:2] += best[3:5] * shift
    return best


def _loss_law_inputs(n_params, tokens, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = _positive("n_params", n_params, "parameters of the run")
    d = _positive("tokens", tokens, "training tokens of the run")
    y = _positive("loss", loss, "final validation loss of the run")
    _same_length(n_params=n, tokens=d, loss=y)
    if len(y) < 5 or len(np.unique(n)) < 2 or len(np.unique(d)) < 2:
        raise ValueError(
            f"approach 3 fits 5 parameters: it needs at least 5 runs over at least 2 sizes and 2 token counts; "
            f"got {len(y)} runs, {len(np.unique(n))} sizes, {len(np.unique(d))} token counts: add runs"
        )
    return n, d, y


def fit_loss_law(n_params, tokens, loss, start: LossLaw | None = None) -> LossLaw:
    """Chinchilla approach 3: Huber (delta 1e-3) on log residuals, L-BFGS from Hoffmann et al.'s grid of starts.

    With `start` (a law fitted to similar runs, as in a bootstrap) one L-BFGS run from there
    replaces the grid.
    """
    n, d, y = _loss_law_inputs(n_params, tokens, loss)
    if start is None:
        values, _ = _huber_objective(_GRID, np.log(n), np.log(d), np.log(y))
        starts = _GRID[np.argsort(values)[:_STARTS]]
    else:
        starts = _theta(start)[None, :]
    with _BLAS.limit(limits=1, user_api="blas"):
        return _law(_fit_theta(n, d, y, starts))
