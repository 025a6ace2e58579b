"""Predict the next run from the sweep before it is trained; then record what it measured.

    sb = fit_sweep(points, members, scale)                   both of Chinchilla's approaches, bootstrapped
    pred = predict_run(sb, members, budget, tokens_per_step)  the member to train at `budget`, its bpb and interval
    write_prediction(folder, pred)                           <sweep folder>/prediction.json, atomically
    pred.measured(result)                                    the same, with the trained run's bpb

The law is approach 3's L(N, D) fitted to the points' validation bits per byte. The run it picks
is the family member with the lowest L(N, C / FLOPs per token) at the budget, counted with the
family's own FLOPs per token (attention included), not Chinchilla's 6 N; the law's optimum between
members and approach 2's N_opt(C) are recorded beside it. The interval is for one measured run
(`new_run=True` in models/scaling_bootstrap.py): the fit's uncertainty and the points' scatter about it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel
from scipy.optimize import minimize_scalar

from infra.workspace.record import write_json_summed
from models.family import FamilyMember, flops_per_token_of
from models.scaling_bootstrap import ScalingBootstrap, bootstrap
from tasks.training.config import PretrainConfig
from tasks.training.scaling.config import ScaleConfig
from tasks.training.scaling.sweep import MeasuredPoint, SweepPoint, point_for

PREDICTION_FILE = "prediction.json"


class Prediction(BaseModel):
    """prediction.json: the run chosen at `budget`, what the sweep predicts for it and, once trained, what it measured."""

    budget: float  # predict_factor x the largest swept budget
    flops: float  # what the chosen run spends: tokens x its FLOPs per token
    depth: int
    n_params: int
    tokens: int
    steps: int
    tokens_per_param: float
    micro_batch_size: int | None = None  # as SweepPoint's
    predicted_bpb: float
    interval: tuple[float, float]  # [low, high] at `level`, for one run's measured value
    level: float
    law_n_params: float  # approach 3's optimum at `budget`, between family members
    law_tokens: float
    isoflop_n_params: float  # approach 2's N_opt(budget), extrapolated
    measured_bpb: float | None = None
    mlflow_run_id: str | None = None
    out_dir: str | None = None

    def point(self) -> SweepPoint:
        return SweepPoint(budget=self.budget, depth=self.depth, n_params=self.n_params,
                          flops_per_token=self.flops / self.tokens, steps=self.steps, tokens=self.tokens,
                          flops=self.flops, tokens_per_param=self.tokens_per_param,
                          micro_batch_size=self.micro_batch_size)

    def measured(self, result: Any) -> "Prediction":
        """This prediction with the trained run's validation bits per byte (a PretrainResult)."""
        return self.model_copy(update={"measured_bpb": result.final_val_bpb, "mlflow_run_id": result.mlflow_run_id,
                                       "out_dir": str(result.out_dir)})

    @property
    def error(self) -> float | None:
        """measured / predicted - 1."""
        return None if self.measured_bpb is None else self.measured_bpb / self.predicted_bpb - 1

    @property
    def inside(self) -> bool | None:
        return None if self.measured_bpb is None else self.interval[0] <= self.measured_bpb <= self.interval[1]


def fit_problem(points: list[SweepPoint]) -> str | None:
    """Why these points cannot be fitted with intervals, or None when they can be tried."""
    sizes: dict[float, set[int]] = {}
    for p in points:
        sizes.setdefault(p.budget, set()).add(p.n_params)
    enough = [b for b, s in sizes.items() if len(s) >= 3]
    if len(enough) < 2 or not any(len(s) >= 4 for s in sizes.values()):
        shown = {f"{b:.3g}": len(s) for b, s in sorted(sizes.items())}
        return (f"sizes per budget {shown}: the fits need at least 2 budgets with 3 sizes and one with 4 "
                "(scale.budgets, scale.sizes_per_budget), so nothing is fitted or predicted")
    return None


def fit_sweep(points: list[MeasuredPoint], members: list[FamilyMember], scale: ScaleConfig) -> ScalingBootstrap:
    """Approaches 2 and 3 on the points' validation bits per byte, with `scale.resamples` bootstrap resamples."""
    return bootstrap([p.budget for p in points], [p.n_params for p in points], [p.tokens for p in points],
                     [p.final_val_bpb for p in points], flops_per_token=flops_per_token_of(members),
                     resamples=scale.resamples, seed=scale.seed)


def predict_run(sb: ScalingBootstrap, members: list[FamilyMember], budget: float, pretrain: PretrainConfig,
                scale: ScaleConfig) -> Prediction:
    """The family member the law says is compute-optimal at `budget`, and its predicted bits per byte (each member
    trained as a sweep point would be: `pretrain`'s batch, `scale.min_steps`)."""
    candidates = []
    for m in members:
        try:
            candidates.append(point_for(budget, m, pretrain, scale))
        except ValueError:  # the budget buys this member less than half a step
            continue
    if not candidates:
        raise ValueError(f"budget C={budget:.3g} buys no family member a whole step; raise scale.predict_factor")
    best = min(candidates, key=lambda p: float(sb.law.loss(p.n_params, p.tokens)))
    pred = sb.predict(best.n_params, best.tokens, new_run=True)
    per_token = flops_per_token_of(members)
    log_n = np.log([m.n_params for m in members])
    # Between members, bounded by the family: a law fitted on small models says little far outside it.
    opt = minimize_scalar(lambda x: float(sb.law.loss(math.exp(x), budget / per_token(math.exp(x)))),
                          bounds=(float(log_n.min()), float(log_n.max())), method="bounded")
    law_n = math.exp(opt.x)
    return Prediction(budget=budget, flops=best.flops, depth=best.depth, n_params=best.n_params, tokens=best.tokens,
                      steps=best.steps, tokens_per_param=best.tokens_per_param,
                      micro_batch_size=best.micro_batch_size, predicted_bpb=pred.loss,
                      interval=(pred.low, pred.high), level=pred.level, law_n_params=law_n,
                      law_tokens=budget / per_token(law_n), isoflop_n_params=sb.isoflop.n_opt(budget))


def write_prediction(folder: Path, prediction: Prediction) -> Path:
    return write_json_summed(Path(folder) / PREDICTION_FILE, prediction)


