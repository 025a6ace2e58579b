"""Synthetic IsoFLOP sweeps drawn from a known loss law (TRUTH) over a few compute budgets (BUDGETS)."""
from __future__ import annotations

import numpy as np

from models.scaling import LossLaw

# A law at this project's scale (N ~ 1e5..1e8, loss in nats); alpha != beta so the optimal
# tokens per parameter moves with C, as it does in practice.
TRUTH = LossLaw(E=1.8, A=400.0, B=1200.0, alpha=0.34, beta=0.30)
BUDGETS = [1e15, 4e15, 1.6e16, 6.4e16]


def sweep(sizes_per_budget: int = 7, noise: float = 0.0, seed: int = 0, budgets=BUDGETS):
    """An IsoFLOP sweep under C = 6 N D: sizes spread over e^-1.5..e^1.5 around each budget's true optimum."""
    c, n = [], []
    for budget in budgets:
        n_opt = TRUTH.optimum(budget).n_params
        for f in np.exp(np.linspace(-1.5, 1.5, sizes_per_budget)):
            c.append(budget)
            n.append(n_opt * f)
    c, n = np.array(c), np.array(n)
    d = c / (6 * n)
    loss = TRUTH.loss(n, d) * np.exp(np.random.default_rng(seed).normal(0.0, noise, len(c)))
    return c, n, d, loss
