"""GRPO math: advantages by hand, k3 KL, the loss against a naive per-token loop, masking."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from models.grpo import group_advantages, grpo_loss, kl_k3


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    adv = group_advantages(rewards, eps=0.0)
    # group 1: mean 0.5, population std 0.5
    assert adv[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])
    # group 2: mean 2, population std sqrt(0.5)
    s = math.sqrt(0.5)
    assert adv[1].tolist() == pytest.approx([1 / s, -1 / s, 0.0, 0.0])


def test_group_advantages_flat_equals_grouped_and_eps():
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.5, 2.0, 0.0])
    flat = group_advantages(rewards, group_size=3, eps=1e-4)
    grouped = group_advantages(rewards.reshape(2, 3), eps=1e-4)
    assert flat.shape == (6,)
    assert torch.allclose(flat, grouped.reshape(-1))
    r = rewards[:3]
    expected = (r - r.mean()) / (r.std(correction=0) + 1e-4)
    assert torch.allclose(flat[:3], expected)


def test_group_advantages_zero_variance_group_is_exactly_zero():
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7], [0.0, 1.0, 0.0]])
    adv = group_advantages(rewards)
    assert torch.equal(adv[0], torch.zeros(3))
    assert torch.equal(adv[1], torch.zeros(3))
    assert adv[2, 1] > 0 > adv[2, 0]


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(5), group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6))
    with pytest.raises(ValueError, match=r"\[N\*G\] or \[N, G\]"):
        group_advantages(torch.zeros(2, 2, 2))


finite = st.floats(min_value=-30, max_value=30, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=16))
def test_kl_k3_non_negative(pairs):
    logp = torch.tensor([p for p, _ in pairs], dtype=torch.float32)
    ref = torch.tensor([r for _, r in pairs], dtype=torch.float32)
    kl = kl_k3(logp, ref)
    assert torch.isfinite(kl).all()
    assert (kl >= 0).all()


def test_kl_k3_zero_when_equal_and_matches_formula():
    x = torch.randn(4, 7)
    assert torch.equal(kl_k3(x, x), torch.zeros_like(x))
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -0.5])
    d = ref - logp
    assert torch.allclose(kl_k3(logp, ref), torch.exp(d) - d - 1)


def naive_grpo_loss(logp, old, ref, adv, mask, clip_eps, beta):
    """Token by token, in Python floats: the reference the vectorised loss must match."""
    total, n = 0.0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            ratio = math.exp(float(logp[b, t]) - float(old[b, t]))
            a = float(adv[b])
            clipped = min(max(ratio, 1 - clip_eps), 1 + clip_eps)
            policy = -min(ratio * a, clipped * a)
            d = float(ref[b, t]) - float(logp[b, t])
            kl = math.exp(d) - d - 1
            total += policy + beta * kl
            n += 1
    return total / n


def random_batch(seed, B=4, T=9):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3  # ratios both in and out of the clip
    ref = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("clip_eps,beta", [(0.2, 0.04), (0.1, 0.0), (0.3, 0.5)])
def test_grpo_loss_matches_naive_loop(seed, clip_eps, beta):
    logp, old, ref, adv, mask = random_batch(seed)
    loss, stats = grpo_loss(logp, old, ref, adv, mask, clip_eps=clip_eps, beta=beta)
    assert float(loss) == pytest.approx(naive_grpo_loss(logp, old, ref, adv, mask, clip_eps, beta), rel=1e-9, abs=1e-12)
    assert 0.0 <= stats["clip_fraction"] <= 1.0
    assert stats["kl"] >= 0
    assert stats["tokens"] == int(mask.sum())


def test_grpo_loss_clip_fraction_counts_active_clips():
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5, 1.05]]))  # ratios vs old = 0
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4, dtype=torch.bool)
    _, pos = grpo_loss(logp, old, logp.clone(), torch.tensor([1.0]), mask, clip_eps=0.2)
    _, neg = grpo_loss(logp, old, logp.clone(), torch.tensor([-1.0]), mask, clip_eps=0.2)
    assert pos["clip_fraction"] == pytest.approx(0.25)  # only ratio 1.5 with A > 0
    assert neg["clip_fraction"] == pytest.approx(0.25)  # only ratio 0.5 with A < 0
    assert pos["ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.5 + 1.05) / 4)
    assert pos["kl"] == 0.0


def test_grpo_loss_at_old_policy_gradient_is_advantage_weighted_logprob_gradient():
    # At ratio 1 with beta 0 the gradient wrt logp[b,t] is -A_b / n_tokens.
    logp, _, ref, adv, mask = random_batch(3)
    logp = logp.clone().requires_grad_(True)
    loss, _ = grpo_loss(logp, logp.detach().clone(), ref, adv, mask, beta=0.0)
    loss.backward()
    expected = torch.where(mask, -adv.unsqueeze(1).expand_as(logp) / mask.sum(), torch.zeros_like(logp))
    assert torch.allclose(logp.grad, expected)


def test_masked_positions_change_neither_loss_nor_gradient():
    logp, old, ref, adv, mask = random_batch(4)
    base = logp.clone().requires_grad_(True)
    loss_a, _ = grpo_loss(base, old, ref, adv, mask)
    loss_a.backward()

    # Scribble over every masked position, including inf and nan, in all three inputs.
    noise = torch.randn_like(logp) * 10
    junk = torch.where(mask, logp, noise)
    junk[~mask] = torch.tensor(float("nan"), dtype=junk.dtype)
    old_j = torch.where(mask, old, torch.full_like(old, float("-inf")))
    ref_j = torch.where(mask, ref, torch.full_like(ref, float("inf")))
    other = junk.clone().requires_grad_(True)
    loss_b, _ = grpo_loss(other, old_j, ref_j, adv, mask)
    loss_b.backward()

    assert torch.isfinite(loss_b)
    assert float(loss_a.detach()) == float(loss_b.detach())
    assert torch.equal(base.grad, other.grad)
    assert torch.equal(other.grad[~mask], torch.zeros_like(other.grad[~mask]))


def test_grpo_loss_shape_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="same"):
        grpo_loss(x, x, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, x, torch.zeros(3), torch.ones(2, 3, dtype=torch.bool))
