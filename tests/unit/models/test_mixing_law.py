"""Mixing laws on synthetic proxies from a known law: the fit recovers it, ranks left-out mixes, proposes the mix the
law says is best within the caps and floor, and gives a new run's interval that holds it."""
from __future__ import annotations

import numpy as np
import pytest

from models.mixing_law import (MixingLaw, choose_model, fit_mixing_law, prediction_interval, propose_mix,
                               proxy_span, sample_mixes)

TRUE = MixingLaw(c=1.5, t=[-1.0, 0.5, 0.8])  # source 0 matches the target; 1 and 2 do not


def proxies(m: int = 12, noise: float = 0.005, seed: int = 0):
    mixes = sample_mixes([1 / 3] * 3, m, seed=seed)
    rng = np.random.default_rng(seed + 1)
    return mixes, TRUE.predict(mixes) + rng.normal(0, noise, m)


def test_mixes_are_drawn_around_the_catalog_within_floor_and_caps():
    mixes = sample_mixes([0.5, 0.3, 0.2], 200, caps=[0.7, 1.0, 0.4], floor=0.05, seed=3)
    assert mixes.shape == (200, 3) and np.allclose(mixes.sum(axis=1), 1)
    assert (mixes >= 0.05).all() and (mixes[:, 0] <= 0.7).all() and (mixes[:, 2] <= 0.4).all()
    assert np.allclose(mixes.mean(axis=0), [0.5, 0.3, 0.2], atol=0.05)
    with pytest.raises(ValueError, match="no mix fits"):
        sample_mixes([0.5, 0.5], 3, floor=0.6)


def test_the_log_linear_law_is_recovered_and_ranks_left_out_mixes():
    mixes, loss = proxies()
    law = fit_mixing_law(mixes, loss)
    grid = sample_mixes([1 / 3] * 3, 50, seed=9)
    assert np.abs(law.predict(grid) - TRUE.predict(grid)).max() < 0.02
    choice = choose_model(mixes, loss)
    assert choice.name == "log_linear" and choice.loo_spearman > 0.9, choice


def test_the_proposal_leans_on_the_matching_source_within_its_cap():
    mixes, loss = proxies()
    law = choose_model(mixes, loss).model
    best = propose_mix(law, caps=[1.0, 1.0, 1.0], floor=0.05)
    assert best.argmax() == 0 and best[0] == pytest.approx(0.9, abs=1e-4)  # all it may take, the floor left
    capped = propose_mix(law, caps=[0.5, 1.0, 1.0], floor=0.05)
    assert capped[0] == pytest.approx(0.5, abs=1e-4) and capped[1] > capped[2]  # then the less harmful source
    assert np.isclose(capped.sum(), 1.0)


def test_a_new_run_lands_inside_its_interval():
    mixes, loss = proxies(noise=0.01)
    best = propose_mix(choose_model(mixes, loss).model, floor=0.05, caps=[1, 1, 1])
    lo, hi = prediction_interval(mixes, loss, best, "log_linear", resamples=300)
    rng = np.random.default_rng(42)
    new = TRUE.predict(best)[0] + rng.normal(0, 0.01, 200)
    inside = np.mean((new >= lo) & (new <= hi))
    assert lo < TRUE.predict(best)[0] < hi and inside > 0.85, (lo, hi, inside)


def test_too_few_proxies_are_refused():
    with pytest.raises(ValueError, match="train at least 5"):
        fit_mixing_law(sample_mixes([1 / 3] * 3, 4), [1.0, 1.1, 1.2, 1.3])


def test_the_quadratic_is_chosen_where_the_sources_interact():
    mixes = sample_mixes([1 / 3] * 3, 30, seed=5)
    loss = 2.0 - 0.5 * mixes[:, 0] + 3.0 * mixes[:, 1] * mixes[:, 2] - 2.0 * mixes[:, 0] ** 2  # not log-linear
    choice = choose_model(mixes, loss)
    assert choice.name == "quadratic" and choice.loo_mse["quadratic"] < choice.loo_mse["log_linear"]
    assert choice.loo_spearman > 0.95


def test_the_proposal_stays_where_the_law_was_fitted():
    mixes, loss = proxies()
    law = choose_model(mixes, loss).model
    low, high = proxy_span(mixes)
    inside = propose_mix(law, caps=[1.0, 1.0, 1.0], floor=0.05, span=(low, high))
    assert inside[0] == pytest.approx(high[0], abs=1e-4) and (inside >= low - 1e-9).all()
    assert inside[0] < 0.9  # unbounded, it would take all it may (above)
    with pytest.raises(ValueError, match="no mix lies within"):
        propose_mix(law, caps=[0.1, 0.1, 1.0], floor=0.5)


def test_the_offset_stays_between_0_and_the_lowest_loss():
    mixes = sample_mixes([1 / 3] * 3, 10, seed=2)
    loss = 0.2 + 0.5 * mixes[:, 1] + 0.01 * np.arange(10) % 0.03  # nearly linear: an unbounded c runs off below 0
    law = fit_mixing_law(mixes, loss)
    assert 0.0 <= law.c <= loss.min()
