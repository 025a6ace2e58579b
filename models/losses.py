"""Token-level losses shared by pretraining, SFT and GRPO.

Both functions take logits and targets that are already aligned (the caller shifts:
targets[:, t] is the token that follows idx[:, t]) and compute in fp32 whatever the
model's dtype, because bf16 log-softmax over a large vocabulary loses too much precision.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # target value that marks a position as not trained on (PyTorch convention)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over positions where mask is True and target != -100 (0 if there are none)."""
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on [B, T]")
    valid = targets != IGNORE_INDEX
    if mask is not None:
        if mask.shape != targets.shape:
            raise ValueError(f"mask {tuple(mask.shape)} must have the targets' shape {tuple(targets.shape)}")
        valid = valid & mask.bool()
    per_token = F.cross_entropy(
        logits.float().flatten(0, 1), targets.masked_fill(~valid, 0).flatten(), reduction="none"
    ).view_as(targets)
    # Dividing by at least one keeps an all-masked batch at loss 0 with a (zero) gradient, not NaN.
    return (per_token * valid).sum() / valid.sum().clamp(min=1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability [B, T] of each target token under softmax(logits); 0 where target == -100."""
    if logits.shape[:2] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on [B, T]")
    valid = targets != IGNORE_INDEX
    logits = logits.float()
    # gather - logsumexp avoids materialising a second [B, T, V] log-softmax tensor.
    picked = logits.gather(-1, targets.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1)
    return (picked - torch.logsumexp(logits, dim=-1)) * valid
