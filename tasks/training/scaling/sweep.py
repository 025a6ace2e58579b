"""An IsoFLOP sweep as ordinary pretraining runs: which family members each compute budget trains, for how long.

    points = plan_sweep(config.scale, config.pretrain, vocab_size)     budgets x sizes, smallest first
    run(Pretrain(point_config(config.pretrain, point, config.scale, val_tokens)), ws, tokens=..., tokenizer=...)
    measured_point(point, result, train_tokens)                       what the fits and the report read

Every point is a member of one model family (models/family.py: depth sets every shape) trained for
D = C / (its FLOPs per token) tokens, rounded to whole optimizer steps, with a cosine schedule over
exactly those steps, on the same token shards, tokenizer, batch shape and learning rate. Each
budget trains `sizes_per_budget` neighbouring depths around the one whose D/N is closest to
`tokens_per_param` (a guess that only centres the sizes; the sweep measures the real optimum), one
more above it than below, because small models' optimum lies at fewer tokens per parameter
than Chinchilla's 20 (nanochat reports 8, then 4).
"""
from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from infra.launch.hostfile import node_count
from models.family import FamilyMember, family_config, family_members
from tasks.training.config import PretrainConfig
from tasks.training.scaling.config import ScaleConfig

EPOCHS_WARN_ABOVE = 4.0  # Muennighoff et al. 2023: up to ~4 epochs of repeated data cost little; past it, more


class SweepPoint(BaseModel):
    """One run of the sweep: a family member, its budget and the whole optimizer steps that spend it."""

    budget: float  # the nominal C the point belongs to (approach 2 groups by it)
    depth: int
    n_params: int  # all parameters (Chinchilla's N)
    flops_per_token: float
    steps: int
    tokens: int  # steps x tokens per step: D, exactly what the schedule ends at
    flops: float  # tokens x flops_per_token: the C actually spent (within half a step of the budget)
    tokens_per_param: float
    micro_batch_size: int | None = None  # its own, smaller than the sweep's (scale.min_steps); None: the sweep's


class MeasuredPoint(SweepPoint):
    """A trained point: its validation loss and bits per byte, how often it saw its data, where it lives."""

    final_val_bpb: float
    final_val_loss: float
    epochs: float  # tokens / the unique training tokens of the shards
    mlflow_run_id: str | None
    out_dir: str


def world_size(cfg: PretrainConfig) -> int:
    """Ranks of a pretraining launch: num_procs on each node of the hostfile (one node without one)."""
    return cfg.launch.num_procs * (node_count(cfg.launch.hostfile) if cfg.launch.hostfile else 1)


def sweep_tokenizer(tokenizer: Any, scale: ScaleConfig) -> Any:
    """The pipeline's tokenizer config (a TokenizerConfig) as the sweep trains it: with `scale.vocab_size` where set."""
    if scale.vocab_size is None:
        return tokenizer
    return type(tokenizer).model_validate({**tokenizer.model_dump(), "vocab_size": scale.vocab_size})


def sweep_pretrain(pretrain: PretrainConfig, scale: ScaleConfig) -> PretrainConfig:
    """The preset's pretraining settings as the sweep trains them: with `scale.micro_batch_size` where set."""
    if scale.micro_batch_size is None:
        return pretrain
    data = pretrain.model_dump()
    data["batch"]["micro_batch_size"] = scale.micro_batch_size
    return PretrainConfig.model_validate(data)


def sweep_members(scale: ScaleConfig, pretrain: PretrainConfig, vocab_size: int) -> list[FamilyMember]:
    """The family the sweep chooses from, at the preset's sequence length and the tokenizer's vocabulary."""
    return family_members(scale.depths, vocab_size, pretrain.batch.seq_len, scale.aspect_ratio, scale.head_dim)


def point_at(budget: float, member: FamilyMember, tokens_per_step: int) -> SweepPoint:
    """`member` trained on the whole steps closest to `budget` FLOPs."""
    steps = round(budget / member.flops_per_token / tokens_per_step)
    if steps < 1:
        raise ValueError(
            f"budget C={budget:.3g} buys depth {member.depth} (N={member.n_params:,}) less than half a step of "
            f"{tokens_per_step:,} tokens: raise scale.budgets or lower the batch (pretrain.batch)"
        )
    tokens = steps * tokens_per_step
    return SweepPoint(budget=budget, depth=member.depth, n_params=member.n_params,
                      flops_per_token=member.flops_per_token, steps=steps, tokens=tokens,
                      flops=tokens * member.flops_per_token, tokens_per_param=tokens / member.n_params)


def point_for(budget: float, member: FamilyMember, pretrain: PretrainConfig, scale: ScaleConfig) -> SweepPoint:
    """`member` at `budget` on the sweep's micro-batch, halved (down to one sequence) while that gives fewer than
    `scale.min_steps` optimizer steps."""
    world, rows = world_size(pretrain), pretrain.batch.micro_batch_size
    point = point_at(budget, member, pretrain.batch.tokens_per_step(world))
    while point.steps < scale.min_steps and rows > 1:
        rows //= 2
        smaller = pretrain.batch.model_copy(update={"micro_batch_size": rows})
        point = point_at(budget, member, smaller.tokens_per_step(world)).model_copy(update={"micro_batch_size": rows})
    return point


def sizes_for(budget: float, members: list[FamilyMember], scale: ScaleConfig) -> list[FamilyMember]:
    """`sizes_per_budget` neighbouring members around the one nearest `tokens_per_param` at `budget`."""
    k = scale.sizes_per_budget
    if k > len(members):
        raise ValueError(f"scale.sizes_per_budget={k} exceeds the {len(members)} family members of scale.depths="
                         f"{scale.depths}: list more depths")
    gap = [abs(math.log(budget / m.flops_per_token / m.n_params / scale.tokens_per_param)) for m in members]
    centre = min(range(len(members)), key=gap.__getitem__)
    first = min(max(centre - (k - 1) // 2, 0), len(members) - k)
    return members[first: first + k]


def plan_sweep(scale: ScaleConfig, pretrain: PretrainConfig, vocab_size: int) -> list[SweepPoint]:
    """Every point of the sweep, budget by budget, smallest model first."""
    members = sweep_members(scale, pretrain, vocab_size)
    return [point_for(b, m, pretrain, scale) for b in scale.budgets for m in sizes_for(b, members, scale)]


def point_config(pretrain: PretrainConfig, point: SweepPoint, scale: ScaleConfig, val_tokens: int) -> PretrainConfig:
    """The preset's pretraining config for one point: its member's shape, its steps (on its own micro-batch where it
    has one), a warmup in proportion.

    No Hugging Face export (a sweep point is a measurement, not a model to ship), no checkpoint before
    the last step, and validation only at the end, where the fits read it, over the whole val split (`val_tokens`): the preset's
    few eval batches are a sample whose noise would be most of the points' scatter about the law
    (docs/experiments/2026-12-05-scaling-sweep-trials.md).
    """
    shape = family_config(point.depth, 1, pretrain.batch.seq_len, scale.aspect_ratio, scale.head_dim)
    overrides: dict[str, Any] = shape.model_dump(exclude={"vocab_size"})
    data = pretrain.model_dump()
    data.update(model_overrides=overrides, steps=point.steps, export_hf=False)
    data["optim"]["warmup_steps"] = round(scale.warmup_fraction * point.steps)
    data["log"]["eval_every"] = 0
    data["checkpoint"]["every"] = 0  # the last step's only: a stop still saves where it stopped, and resumes there
    if point.micro_batch_size is not None:
        data["batch"]["micro_batch_size"] = point.micro_batch_size
    rows = data["batch"]["micro_batch_size"] * world_size(pretrain)
    data["log"]["eval_batches"] = max(1, (val_tokens - 1) // pretrain.batch.seq_len // rows)
    return PretrainConfig.model_validate(data)


def measured_point(point: SweepPoint, result: Any, train_tokens: int) -> MeasuredPoint:
    """`point` with what its pretraining run measured (a PretrainResult)."""
    if result.final_val_bpb is None or result.final_val_loss is None:
        raise ValueError(f"sweep point depth {point.depth} at C={point.budget:.3g} ({result.out_dir}) has no validation "
                         "loss: the token shards' val split is shorter than a window; use a larger data.mix.total")
    return MeasuredPoint(**point.model_dump(), final_val_bpb=result.final_val_bpb, final_val_loss=result.final_val_loss,
                         epochs=point.tokens / max(train_tokens, 1), mlflow_run_id=result.mlflow_run_id,
                         out_dir=str(result.out_dir))


def epoch_warnings(points: list[SweepPoint], train_tokens: int) -> list[str]:
    """One line per point that repeats its data more than EPOCHS_WARN_ABOVE times."""
    return [f"depth {p.depth} at C={p.budget:.3g} trains {p.tokens:,} tokens on {train_tokens:,} unique: "
            f"{p.tokens / train_tokens:.1f} epochs, past {EPOCHS_WARN_ABOVE:g} (Muennighoff et al. 2023: repeated "
            "tokens are then worth less than new ones, and the law's D overstates its data); add data or lower the budget"
            for p in points if p.tokens > EPOCHS_WARN_ABOVE * train_tokens]
