"""A GRPO run whose reward and KL stayed flat is told apart from one that moved."""
from __future__ import annotations

import numpy as np

from tasks.training.grpo.stage import flat_training


def _history(reward, kl):
    return [{"reward_mean": float(r), "kl": float(k)} for r, k in zip(reward, kl)]


def test_flat_when_neither_reward_nor_kl_moves_beyond_noise() -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(0.5, 0.05, 40)
    tiny_kl = np.abs(rng.normal(1e-4, 1e-4, 40))
    assert flat_training(_history(noise, tiny_kl))
    rising = noise + np.linspace(0.0, 0.3, 40)
    assert not flat_training(_history(rising, tiny_kl))  # the reward rose
    assert not flat_training(_history(noise, np.linspace(0.0, 0.05, 40) + tiny_kl))  # the policy left the reference
    assert not flat_training(_history(noise[:6], tiny_kl[:6]))  # too few steps to call it flat
    assert not flat_training([])
