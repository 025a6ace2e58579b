"""A model family for scaling sweeps: one knob, depth, sets every shape, so sizes differ by one number.

    dim = depth * aspect_ratio      n_heads = n_kv_heads = dim / head_dim (head_dim fixed)
    ffn_hidden = 8/3 * dim rounded up to a multiple of 64, as in models/presets.py

nanochat ties its sizes the same way (`model_dim = depth * aspect_ratio`, fixed head_dim), so
a sweep over depth moves width with it instead of making deep-thin or shallow-wide outliers.
At aspect_ratio = head_dim = 64, depth 12 is the gpt124m preset's shape.

    family_config(depth, vocab_size, max_seq_len)      one member's ModelConfig
    family_members(depths, vocab_size, max_seq_len)    each member's N and training FLOPs per token
    plan_isoflop_runs(compute, target_sizes, members)  which depths to train at a budget, on how many tokens
    flops_per_token_of(members)                        N -> FLOPs per token, for fit_isoflop_profiles
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel

from models.flops import flops_per_token, num_params
from models.llama import ModelConfig

ASPECT_RATIO = 64
HEAD_DIM = 64


def family_config(depth: int, vocab_size: int, max_seq_len: int, aspect_ratio: int = ASPECT_RATIO,
                  head_dim: int = HEAD_DIM) -> ModelConfig:
    """The family member with `depth` layers."""
    if depth < 1:
        raise ValueError(f"depth={depth} must be at least 1 (layers of the family member)")
    if aspect_ratio < 1 or head_dim < 1 or aspect_ratio % head_dim:
        raise ValueError(
            f"aspect_ratio={aspect_ratio} must be a positive multiple of head_dim={head_dim}, so every depth's "
            "width splits into whole heads; e.g. aspect_ratio=64, head_dim=64"
        )
    dim = depth * aspect_ratio
    n_heads = dim // head_dim
    return ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=depth, n_heads=n_heads, n_kv_heads=n_heads,
                       ffn_hidden=64 * math.ceil(8 * dim / 3 / 64), max_seq_len=max_seq_len)


class FamilyMember(BaseModel):
    """One depth of the family, with what a scaling fit needs to know about it."""

    depth: int
    n_params: int  # all parameters, embeddings included (Chinchilla's N)
    n_params_non_embedding: int  # Kaplan's N
    flops_per_token: float  # training FLOPs per token at max_seq_len (models/flops.py)
    config: ModelConfig


def family_members(depths: Sequence[int], vocab_size: int, max_seq_len: int, aspect_ratio: int = ASPECT_RATIO,
                   head_dim: int = HEAD_DIM) -> list[FamilyMember]:
    """Members at `depths`, smallest first."""
    members = []
    for depth in sorted(set(depths)):
        cfg = family_config(depth, vocab_size, max_seq_len, aspect_ratio, head_dim)
        members.append(FamilyMember(depth=depth, n_params=num_params(cfg),
                                    n_params_non_embedding=num_params(cfg, include_embeddings=False),
                                    flops_per_token=flops_per_token(cfg, max_seq_len), config=cfg))
    if not members:
        raise ValueError("depths is empty: name the depths of the family to list, e.g. range(2, 13)")
    return members


class IsoFlopRun(BaseModel):
    """One point of an IsoFLOP sweep: a family member trained on the tokens its budget buys."""

    compute: float
    depth: int
    n_params: int
    flops_per_token: float
    tokens: int  # compute / flops_per_token, rounded down
    tokens_per_param: float


def plan_isoflop_runs(compute: float, target_sizes: Sequence[float],
                      members: Sequence[FamilyMember]) -> list[IsoFlopRun]:
    """For each target N the member nearest in log N, trained for D = C / (its FLOPs per token) tokens."""
    if not compute > 0:
        raise ValueError(f"compute={compute} must be positive (training FLOPs of the budget)")
    if not members:
        raise ValueError("members is empty: list them with family_members(depths, vocab_size, max_seq_len)")
    members = sorted(members, key=lambda m: m.n_params)
    sizes = np.array([m.n_params for m in members], dtype=float)
    runs: dict[int, IsoFlopRun] = {}
    for target in target_sizes:
        if not sizes.min() <= target <= sizes.max():
            raise ValueError(
                f"target size {target:.3g} lies outside the family's {sizes.min():.3g}..{sizes.max():.3g} "
                f"parameters (depths {members[0].depth}..{members[-1].depth}): widen the depths or move the target"
            )
        m = members[int(np.argmin(np.abs(np.log(sizes) - math.log(target))))]
        if m.depth in runs:
            raise ValueError(
                f"target size {target:.3g} and another target both round to depth {m.depth}: spread the targets "
                "further apart (a sweep needs distinct sizes per budget)"
            )
        tokens = int(compute // m.flops_per_token)
        if tokens < m.config.max_seq_len:
            raise ValueError(
                f"budget C={compute:.3g} buys depth {m.depth} only {tokens} tokens, less than one sequence of "
                f"{m.config.max_seq_len}: raise the budget or drop that size"
            )
        runs[m.depth] = IsoFlopRun(compute=compute, depth=m.depth, n_params=m.n_params,
                                   flops_per_token=m.flops_per_token, tokens=tokens,
                                   tokens_per_param=tokens / m.n_params)
    return [runs[d] for d in sorted(runs)]


def flops_per_token_of(members: Sequence[FamilyMember]) -> Callable[[float], float]:
    """FLOPs per token at any N, straight lines in log-log between members (and past the ends).

    Approach 2's N_opt falls between family members; this prices its D_opt with the family's
    own FLOP count instead of 6 N, which leaves out attention and counts the input embedding.
    """
    if len(members) < 2:
        raise ValueError(f"flops_per_token_of needs at least 2 family members to interpolate; got {len(members)}")
    members = sorted(members, key=lambda m: m.n_params)
    x = np.log([m.n_params for m in members])
    y = np.log([m.flops_per_token for m in members])

    def per_token(n_params: float) -> float:
        lx = math.log(n_params)
        i = int(np.clip(np.searchsorted(x, lx), 1, len(x) - 1))
        slope = (y[i] - y[i - 1]) / (x[i] - x[i - 1])
        return math.exp(y[i - 1] + slope * (lx - x[i - 1]))

    return per_token
