"""The `scale:` section of a preset (torch-free, as flows/config.py needs; tasks/training/scaling/sweep.py plans from it)."""
from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from infra.config import StrictModel


class ScaleConfig(StrictModel):
    """The `scale:` section of a preset: the budgets, the family, and the run predicted before it is trained."""

    budgets: list[float] = Field(default_factory=lambda: [2e12, 4e12, 8e12])  # training FLOPs (models/flops.py count)
    sizes_per_budget: int = Field(default=4, ge=1)  # the fits need >= 3 per budget, and one budget with 4
    depths: list[int] = Field(default_factory=lambda: list(range(1, 13)))  # the family members to choose from
    aspect_ratio: int = Field(default=64, gt=0)  # width = depth * aspect_ratio (models/family.py ASPECT_RATIO)
    head_dim: int = Field(default=64, gt=0)  # models/family.py HEAD_DIM
    # The sweep's own tokenizer vocabulary (None: the pipeline's). A small vocabulary keeps the tied embedding
    # from being most of a small member's parameters, so that small budgets still bracket their optimum.
    vocab_size: int | None = Field(default=None, gt=0)
    # The sweep's own micro-batch (None: the preset's pretraining one). Small budgets on a large batch give the larger
    # members too few optimizer steps, and the smallest member then wins at every budget
    # (docs/experiments/2026-12-05-scaling-sweep-trials.md).
    micro_batch_size: int | None = Field(default=None, gt=0)
    # A point with fewer optimizer steps than this trains on a smaller micro-batch (halved, down to one sequence):
    # the same tokens in more steps. A large member's short run is otherwise a few hundred steps, most of them
    # warm-up and decay, and lies above the law the other points follow
    # (docs/experiments/2026-12-05-scaling-sweep-trials.md). 0: one micro-batch for all.
    min_steps: int = Field(default=0, ge=0)
    tokens_per_param: float = Field(default=20.0, gt=0)  # centres each budget's sizes (a guess, not a result)
    predict_factor: float = Field(default=4.0, gt=1, le=1000)  # the predicted, then trained run: this x the largest budget
    warmup_fraction: float = Field(default=0.05, ge=0, lt=1)  # of each point's steps (the preset's warmup_steps is not used)
    resamples: int = Field(default=200, ge=10)  # bootstrap resamples of the fits
    seed: int = 0  # of the bootstrap

    @field_validator("depths")
    @classmethod
    def _depths(cls, depths: list[int]) -> list[int]:
        if not depths or any(d < 1 for d in depths):
            raise ValueError(f"scale.depths={depths} must name at least one depth of 1 or more, e.g. [1, 2, 3, 4]")
        return depths

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, budgets: list[float]) -> list[float]:
        if not budgets or any(b <= 0 for b in budgets) or len(set(budgets)) != len(budgets):
            raise ValueError(f"scale.budgets={budgets} must be distinct positive FLOP counts, e.g. [2e12, 4e12, 8e12]")
        return sorted(budgets)

    @model_validator(mode="after")
    def _sizes_among_the_depths(self) -> "ScaleConfig":
        if self.sizes_per_budget > len(self.depths):
            raise ValueError(f"scale.sizes_per_budget={self.sizes_per_budget} exceeds the {len(self.depths)} family "
                             f"members of scale.depths={self.depths}: list more depths or lower sizes_per_budget")
        return self
