"""GRPO math in plain torch: group-relative advantages, the k3 KL estimator, the clipped loss.

GRPO (Shao et al., 2024, DeepSeekMath) drops PPO's value model: each prompt is sampled G
times and a completion's advantage is its reward standardised within its group.

Normalisation: the loss is a token-level mean over all completion tokens of the batch
(as in DAPO, Yu et al., 2025), not the GRPO paper's per-sequence mean followed by a batch
mean. With the per-sequence mean a token of a long completion weighs less than a token
of a short one, which biases the policy towards short wrong answers and long right ones;
the token-level mean weighs every generated token the same.
"""
from __future__ import annotations

import torch

# exp() of a log-ratio beyond this is inf in float32 anyway; clamping keeps the loss finite
# (its gradient is then zero there, which the ratio clipping would mostly do too).
MAX_LOG_RATIO = 20.0


def group_advantages(rewards: torch.Tensor, group_size: int | None = None, eps: float = 1e-4) -> torch.Tensor:
    """(r - group mean) / (group std + eps), same shape as `rewards`.

    `rewards` is [N, G] (one row per prompt) or flat [N*G] with `group_size` G, groups
    contiguous. The std is the population std (divide by G), defined for any G >= 1. A
    group whose rewards are all equal carries no signal and gets exactly zero advantages.
    """
    flat = rewards.dim() == 1
    if flat:
        if group_size is None or group_size < 1 or rewards.numel() % group_size:
            raise ValueError(
                f"flat rewards of length {rewards.numel()} need group_size dividing it, got group_size={group_size}"
            )
        grouped = rewards.reshape(-1, group_size)
    elif rewards.dim() == 2:
        if group_size is not None and group_size != rewards.shape[1]:
            raise ValueError(f"rewards are [N, G] with G={rewards.shape[1]} but group_size={group_size}")
        grouped = rewards
    else:
        raise ValueError(f"rewards must be [N*G] or [N, G], got shape {tuple(rewards.shape)}")
    grouped = grouped.to(torch.float32)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, correction=0)
    adv = (grouped - mean) / (std + eps)
    # Equal rewards can still leave rounding noise in (r - mean); set those groups to 0 exactly.
    all_equal = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    adv = torch.where(all_equal, torch.zeros_like(adv), adv)
    return adv.reshape(rewards.shape)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref_logp - logp; >= 0.

    Unbiased for the KL when tokens are sampled from the policy (Schulman, "Approximating
    KL divergence", 2020). Computed as expm1(d) - d, which does not round below zero for
    tiny d the way exp(d) - d - 1 does.
    """
    d = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return (torch.expm1(d) - d).clamp_min(0.0)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    beta: float = 0.04,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss over completion tokens and its statistics.

    Per token: -min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A) + beta * KL,
    with ratio = exp(logp - old_logp) and KL the k3 estimate against the reference;
    averaged over the tokens where `mask` is True (token-level mean, see module doc).
    Tensors are [B, T] except `advantages` [B]. Masked-out positions (prompt, padding,
    after EOS) contribute neither value nor gradient, whatever they hold (even inf/nan).
    Stats: clip_fraction (share of tokens where the clip was active), kl, ratio_mean.
    """
    if logp.shape != old_logp.shape or logp.shape != ref_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, ref_logp {tuple(ref_logp.shape)} "
            f"and mask {tuple(mask.shape)} must have the same [B, T] shape"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    mask = mask.to(torch.bool)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Replace masked entries before any arithmetic so they cannot leak inf/nan into the
    # loss or, through torch.where's backward, into the gradient.
    logp = torch.where(mask, logp, zero)
    old_logp = torch.where(mask, old_logp.detach(), zero)
    ref_logp = torch.where(mask, ref_logp.detach(), zero)
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)

    log_ratio = (logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    policy_term = -torch.minimum(unclipped, clipped)
    kl = kl_k3(logp, ref_logp)
    per_token = policy_term + beta * kl

    n_tokens = mask.sum().clamp_min(1)
    maskf = mask.to(logp.dtype)
    loss = (per_token * maskf).sum() / n_tokens

    with torch.no_grad():
        is_clipped = ((adv > 0) & (ratio > 1.0 + clip_eps)) | ((adv < 0) & (ratio < 1.0 - clip_eps))
        stats = {
            "clip_fraction": float((is_clipped & mask).sum() / n_tokens),
            "kl": float((kl * maskf).sum() / n_tokens),
            "ratio_mean": float((ratio * maskf).sum() / n_tokens),
            "tokens": int(mask.sum()),
        }
    return loss, stats
