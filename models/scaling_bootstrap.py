"""How sure a scaling-law fit is: bootstrap intervals of its numbers and of the loss it predicts.

    sb = bootstrap(compute, n_params, tokens, loss, flops_per_token=six_n)   -> ScalingBootstrap
    sb.intervals(compute)              95% intervals of a, b, alpha, beta, E and tokens per parameter
    sb.predict(n_params, tokens)       the loss of one run, with its interval
    sb.predict_at_compute(compute)     the same at the fitted compute-optimal N*, D* of a budget

Each resample refits both of Chinchilla's approaches (models/scaling.py); an interval is the
percentile interval of the resampled values. The intervals are the fit's uncertainty; a
prediction for a run yet to be trained can add the runs' own scatter about the law
(`new_run=True`), which a single measured run also carries.
"""
from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel

from models.scaling import FlopsPerToken, IsoFlopFit, LossLaw, fit_isoflop_profiles, fit_loss_law

LEVEL = 0.95


class Interval(BaseModel):
    """A point estimate and its percentile-bootstrap interval."""

    estimate: float
    low: float
    high: float


class ScalingIntervals(BaseModel):
    """Intervals of the fitted exponents, E, and the optimal tokens per parameter at one budget."""

    level: float
    compute: float  # where tokens_per_param is read: the law's optimum moves with C unless alpha = beta
    a: Interval  # approach 2: N_opt ~ C^a
    b: Interval  # approach 2: D_opt ~ C^b
    alpha: Interval
    beta: Interval
    E: Interval
    tokens_per_param: Interval  # approach 3's D_opt / N_opt at `compute`, under C = 6 N D


class LossPrediction(BaseModel):
    """The fitted law's loss at one (N, D), with the bootstrap interval of the law there."""

    n_params: float
    tokens: float
    compute: float  # 6 N D
    loss: float
    low: float
    high: float
    level: float
    new_run: bool  # the interval includes the runs' scatter about the law


class ScalingBootstrap(BaseModel):
    """Both fits on all runs, and on each resample; read it through its methods."""

    level: float
    seed: int
    resamples: int
    isoflop: IsoFlopFit
    law: LossLaw
    isoflop_exponents: list[tuple[float, float]]  # (a, b) of each resample whose parabolas all had a minimum
    laws: list[LossLaw]  # approach 3 on each resample
    log_residuals: list[float]  # ln(loss / law) of each run, scaled by sqrt(n / (n - 5)) for the 5 fitted parameters

    def _interval(self, estimate: float, samples) -> Interval:
        tail = 100 * (1 - self.level) / 2
        low, high = np.percentile(np.asarray(samples, dtype=float), [tail, 100 - tail])
        return Interval(estimate=estimate, low=float(low), high=float(high))

    def intervals(self, compute: float) -> ScalingIntervals:
        ab = np.array(self.isoflop_exponents)
        tokens_per_param = [law.optimum(compute).tokens_per_param for law in self.laws]
        return ScalingIntervals(
            level=self.level, compute=compute,
            a=self._interval(self.isoflop.a, ab[:, 0]), b=self._interval(self.isoflop.b, ab[:, 1]),
            **{key: self._interval(getattr(self.law, key), [getattr(law, key) for law in self.laws])
               for key in ("alpha", "beta", "E")},
            tokens_per_param=self._interval(self.law.optimum(compute).tokens_per_param, tokens_per_param),
        )

    def predict(self, n_params: float, tokens: float, new_run: bool = False) -> LossPrediction:
        """The law's loss at (N, D), and the interval of the resampled laws there.

        With new_run, every resampled law is paired with every run's residual, so the interval
        is for one run's measured loss rather than for the law.
        """
        if not (n_params > 0 and tokens > 0):
            raise ValueError(f"predict needs a positive size and token count; got n_params={n_params}, tokens={tokens}")
        point = float(self.law.loss(n_params, tokens))
        samples = np.array([law.loss(n_params, tokens) for law in self.laws])
        if new_run:
            samples = np.outer(samples, np.exp(self.log_residuals)).ravel()
        iv = self._interval(point, samples)
        return LossPrediction(n_params=n_params, tokens=tokens, compute=6.0 * n_params * tokens, loss=point,
                              low=iv.low, high=iv.high, level=self.level, new_run=new_run)

    def predict_at_compute(self, compute: float, new_run: bool = False) -> LossPrediction:
        """The loss at the fitted law's compute-optimal (N*, D*) for C = 6 N D.

        N* and D* are the all-runs fit's and stay fixed across resamples: the interval is for
        the run one would actually train, not for an optimum that moves with each resample.
        """
        best = self.law.optimum(compute)
        return self.predict(best.n_params, best.tokens, new_run)


def _parabola_residuals(fit: IsoFlopFit, c: np.ndarray, n: np.ndarray, y: np.ndarray):
    """Each run's loss on its budget's parabola, and the residuals scaled by sqrt(k / (k - 3)).

    A parabola through k runs leaves residuals smaller than the noise by that factor (3 of its
    k degrees of freedom went into the fit); with k = 3 it leaves none, so those budgets add nothing.
    """
    fitted = np.empty_like(y)
    residuals = []
    for m in fit.minima:
        at = c == m.compute
        fitted[at] = m.parabola(n[at])
        k = int(at.sum())
        if k > 3:
            residuals.append((y[at] - fitted[at]) * math.sqrt(k / (k - 3)))
    if not residuals:
        raise ValueError(
            "every budget has exactly 3 runs, so each parabola passes through its points and leaves no residual "
            "to resample for intervals of a and b: add a size (or a second seed) to at least one budget"
        )
    return fitted, np.concatenate(residuals)


def bootstrap(compute, n_params, tokens, loss, *, flops_per_token: FlopsPerToken, resamples: int = 200,
              seed: int = 0, level: float = LEVEL) -> ScalingBootstrap:
    """Fit both approaches on all runs, then on `resamples` seeded resamples.

    Both approaches resample residuals, not runs: the budgets and sizes are the sweep's design and
    only the runs' losses are noisy measurements, so every resample keeps every run's (N, D).
    Approach 2: each budget's parabola plus residuals drawn from all budgets' parabolas.
    Approach 3: the all-runs law times exp() of its log residuals drawn with replacement. Resampling
    a budget's 4 runs instead keeps all 4 sizes in about one resample in ten and loses its largest
    or smallest in about half; a parabola through repeated points says nothing, and a law fitted
    without the largest sizes is extrapolated further than the sweep was, which widens the intervals
    (docs/experiments/2026-12-05-scaling-sweep-trials.md). Refits start from the all-runs law, whose
    grid search already found the basin. A resample whose parabola at some budget has no bracketed
    minimum is left out of a and b; if more than half are, the sweep is too noisy for those intervals
    and this raises.
    """
    if resamples < 10:
        raise ValueError(f"resamples={resamples} is too few for a {level:.0%} interval; use 200 or more")
    if not 0 < level < 1:
        raise ValueError(f"level={level} must be in (0, 1), e.g. 0.95")
    isoflop = fit_isoflop_profiles(compute, n_params, loss, flops_per_token=flops_per_token)
    c, n, d, y = (np.asarray(v, dtype=float).ravel() for v in (compute, n_params, tokens, loss))
    fitted, residuals = _parabola_residuals(isoflop, c, n, y)
    law = fit_loss_law(n, d, y)  # with the IsoFLOP fit, this has checked every input
    log_fitted = np.log(law.loss(n, d))
    # Scaled by sqrt(n / (n - 5)): a fit of 5 parameters leaves residuals smaller than the noise.
    log_residuals = (np.log(y) - log_fitted) * math.sqrt(len(y) / max(len(y) - 5, 1))

    rng = np.random.default_rng(seed)
    exponents, laws = [], []
    for _ in range(resamples):
        try:
            fit = fit_isoflop_profiles(c, n, fitted + rng.choice(residuals, size=len(y)),
                                       flops_per_token=flops_per_token)
            exponents.append((fit.a, fit.b))
        except ValueError:  # a parabola opened downward or lost its bracketed minimum
            pass
        try:
            resampled = fit_loss_law(n, d, np.exp(log_fitted + rng.choice(log_residuals, size=len(y))), start=law)
        except ValueError:  # a resample whose fit diverged
            continue
        if resampled.alpha > 0 and resampled.beta > 0:  # else no law of loss falling with N and D: left out too
            laws.append(resampled)
    if len(exponents) < resamples / 2:
        raise ValueError(
            f"only {len(exponents)} of {resamples} resamples had a bracketed minimum at every budget: the "
            "sweep is too noisy for intervals of a and b; add sizes per budget or seeds per size"
        )
    if len(laws) < resamples / 2:
        raise ValueError(
            f"only {len(laws)} of {resamples} resamples could be fitted by approach 3: the sweep does not pin "
            "L(N, D) down; add sizes per budget or budgets"
        )
    return ScalingBootstrap(level=level, seed=seed, resamples=resamples, isoflop=isoflop, law=law,
                            isoflop_exponents=exponents, laws=laws, log_residuals=log_residuals.tolist())
