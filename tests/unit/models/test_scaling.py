"""Scaling-law fits against synthetic sweeps drawn from a known law, Chinchilla's published
constants, and the model family that feeds a sweep."""
from __future__ import annotations

import math

import numpy as np
import pytest

from models.family import family_config, family_members, flops_per_token_of, plan_isoflop_runs
from models.flops import flops_per_token, num_params
from models.llama import model_config
from models.scaling import LossLaw, fit_isoflop_profiles, fit_loss_law, six_n
from models.scaling_bootstrap import ScalingBootstrap, bootstrap
from tests.helpers.scaling_sweeps import BUDGETS, TRUTH, sweep

# ----------------------------------------------------------------------------- approach 2


def test_isoflop_profiles_recover_the_exponents_noise_free():
    c, n, _, loss = sweep()
    fit = fit_isoflop_profiles(c, n, loss, flops_per_token=six_n)
    s = TRUTH.alpha + TRUTH.beta
    # Along an IsoFLOP line both terms of the law scale by the same factor of C, so every
    # budget's curve has the same shape in ln(N / N_opt): the parabola's bias cancels in the slope.
    assert fit.a == pytest.approx(TRUTH.beta / s, abs=1e-6)
    assert fit.b == pytest.approx(TRUTH.alpha / s, abs=1e-6)
    for m in fit.minima:
        assert m.n_params == pytest.approx(TRUTH.optimum(m.compute).n_params, rel=0.05)
        assert m.tokens == pytest.approx(m.compute / (6 * m.n_params))
    assert fit.n_opt(1e18) == pytest.approx(TRUTH.optimum(1e18).n_params, rel=0.05)


def test_isoflop_profiles_with_noise_stay_close():
    c, n, _, loss = sweep(noise=0.002, seed=1)
    fit = fit_isoflop_profiles(c, n, loss, flops_per_token=six_n)
    s = TRUTH.alpha + TRUTH.beta
    assert fit.a == pytest.approx(TRUTH.beta / s, abs=0.03)
    assert fit.b == pytest.approx(TRUTH.alpha / s, abs=0.03)


def test_isoflop_tokens_come_from_the_callers_flop_count():
    c, n, _, loss = sweep()
    per_token = lambda n_params: 6 * n_params + 3e6  # noqa: E731 (an attention-like constant)
    fit = fit_isoflop_profiles(c, n, loss, flops_per_token=per_token)
    for m in fit.minima:
        assert m.tokens == pytest.approx(m.compute / per_token(m.n_params))


# ----------------------------------------------------------------------------- approach 3


def test_loss_law_recovers_the_truth_noise_free():
    _, n, d, loss = sweep()
    law = fit_loss_law(n, d, loss)
    for key in ("E", "A", "B", "alpha", "beta"):
        assert getattr(law, key) == pytest.approx(getattr(TRUTH, key), rel=1e-4), key


def test_closed_form_optimum_is_the_minimum_along_the_budget():
    compute = 1e19
    best = TRUTH.optimum(compute)
    n = np.exp(np.linspace(math.log(best.n_params) - 3, math.log(best.n_params) + 3, 200001))
    loss = TRUTH.loss(n, compute / (6 * n))
    assert n[np.argmin(loss)] == pytest.approx(best.n_params, rel=1e-3)
    assert loss.min() == pytest.approx(best.loss, rel=1e-9)
    assert 6 * best.n_params * best.tokens == pytest.approx(compute)


GOPHER_COMPUTE = 5.76e23  # FLOPs of Gopher, and of Chinchilla: 70B parameters on 1.4T tokens


def test_chinchilla_published_constants_do_not_give_70b():
    # Issue 29 asked that Chinchilla's published approach-3 constants reproduce their 70B /
    # 1.4T optimum. They do not, and this test says so rather than loosening a tolerance.
    # Hoffmann et al. 2022, eq. 10 (paper body): E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28.
    # The closed form gives G = (0.34 * 406.4 / (0.28 * 410.7))^(1/0.62) = 1.3447 (by hand) and
    # about 32B parameters on 3.0T tokens, ~93 tokens per parameter. Hoffmann et al. sized
    # Chinchilla from approaches 1 and 2, not from these constants.
    law = LossLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
    best = law.optimum(GOPHER_COMPUTE)
    assert best.n_params == pytest.approx(3.219e10, rel=1e-3)
    assert best.tokens == pytest.approx(2.982e12, rel=1e-3)
    assert abs(best.n_params / 70e9 - 1) > 0.5  # nowhere near 70B
    # The valley is flat: Chinchilla's own (70B, 1.4T) sits within 0.5% of the optimal loss.
    assert law.loss(70e9, 1.4e12) == pytest.approx(best.loss, rel=5e-3)
    # The less rounded exponents of the paper's TeX source (alpha=0.3392, beta=0.2849, as quoted by
    # Besiroglu et al. 2024) move it to ~40B on 2.4T: closer, still not 70B / 1.4T.
    tex = LossLaw(E=1.6934, A=406.4, B=410.7, alpha=0.3392, beta=0.2849).optimum(GOPHER_COMPUTE)
    assert tex.n_params == pytest.approx(4.03e10, rel=0.01)


def test_chinchilla_optimum_from_the_epoch_ai_refit():
    # The constants that do reproduce 70B / 1.4T within 10%: Besiroglu, Erdil, Barnett and You 2024,
    # "Chinchilla Scaling: A replication attempt" (Epoch AI, arXiv:2404.10102), who refit approach 3
    # (Huber delta 1e-3, L-BFGS, as models/scaling.py does) to the runs they reconstructed from
    # Hoffmann et al.'s Figure 4: E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658. These
    # figures were taken from independent copies of their estimates table found in this session's
    # reference library, not re-read from the paper's PDF. The closed form gives 72.2B parameters on
    # 1.33T tokens (18.4 tokens per parameter): +3% and -5% from Chinchilla's 70B and 1.4T.
    law = LossLaw(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
    best = law.optimum(GOPHER_COMPUTE)
    assert best.n_params == pytest.approx(7.22e10, rel=1e-2)
    assert best.n_params == pytest.approx(70e9, rel=0.10)
    assert best.tokens == pytest.approx(1.4e12, rel=0.10)
    assert best.tokens_per_param == pytest.approx(20, rel=0.10)


# ----------------------------------------------------------------------------- bootstrap


@pytest.fixture(scope="module")
def noisy_bootstrap() -> ScalingBootstrap:
    c, n, d, loss = sweep(noise=0.002, seed=2)
    # 40 resamples keep the test fast; the default 200 is what a sweep's report uses.
    return bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=40, seed=0)


def test_loss_law_with_noise_stays_close(noisy_bootstrap):
    law = noisy_bootstrap.law  # fit_loss_law on all the noisy runs
    assert law.alpha == pytest.approx(TRUTH.alpha, abs=0.02)
    assert law.beta == pytest.approx(TRUTH.beta, abs=0.02)
    assert law.E == pytest.approx(TRUTH.E, rel=0.1)
    compute = 4 * BUDGETS[-1]
    assert law.optimum(compute).n_params == pytest.approx(TRUTH.optimum(compute).n_params, rel=0.25)


def test_bootstrap_intervals_contain_the_truth(noisy_bootstrap):
    compute = 4 * BUDGETS[-1]
    iv = noisy_bootstrap.intervals(compute)
    s = TRUTH.alpha + TRUTH.beta
    truth = dict(a=TRUTH.beta / s, b=TRUTH.alpha / s, alpha=TRUTH.alpha, beta=TRUTH.beta, E=TRUTH.E,
                 tokens_per_param=TRUTH.optimum(compute).tokens_per_param)
    for key, value in truth.items():
        interval = getattr(iv, key)
        assert interval.low <= interval.estimate <= interval.high, key
        assert interval.low <= value <= interval.high, (key, value, interval)


def test_prediction_at_a_larger_budget_covers_the_true_loss(noisy_bootstrap):
    compute = 4 * BUDGETS[-1]
    pred = noisy_bootstrap.predict_at_compute(compute)
    assert pred.compute == pytest.approx(compute)
    assert pred.low <= TRUTH.loss(pred.n_params, pred.tokens) <= pred.high
    assert (pred.high - pred.low) / 2 < 0.02 * pred.loss
    assert pred.n_params == pytest.approx(TRUTH.optimum(compute).n_params, rel=0.25)
    # One run's loss scatters about the law: its interval holds the law's and is wider.
    run = noisy_bootstrap.predict_at_compute(compute, new_run=True)
    assert run.loss == pred.loss and run.low < pred.low and run.high > pred.high


def test_bootstrap_of_a_small_sweep_keeps_every_size():
    # The scaling flow's default: 3 budgets x 4 sizes. Resampling runs within a budget would
    # often lose a size; resampling residuals does not, so most resamples count.
    c, n, d, loss = sweep(sizes_per_budget=4, noise=0.002, seed=3, budgets=BUDGETS[:3])
    sb = bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=10, seed=0)
    assert len(sb.isoflop_exponents) >= 8 and len(sb.laws) == 10
    iv = sb.intervals(4 * BUDGETS[2])
    assert iv.a.low < iv.a.high and iv.alpha.low < iv.alpha.high


def test_bootstrap_round_trips_through_json(noisy_bootstrap):
    again = ScalingBootstrap.model_validate_json(noisy_bootstrap.model_dump_json())
    assert again.intervals(1e17) == noisy_bootstrap.intervals(1e17)
    assert again.predict(1e7, 1e9) == noisy_bootstrap.predict(1e7, 1e9)


# ----------------------------------------------------------------------------- bad input


def test_isoflop_profiles_refuse_a_single_budget():
    c, n, _, loss = sweep()
    first = c == BUDGETS[0]
    with pytest.raises(ValueError, match="at least 2 budgets"):
        fit_isoflop_profiles(c[first], n[first], loss[first], flops_per_token=six_n)


def test_isoflop_profiles_refuse_a_budget_with_two_sizes():
    c, n, _, loss = sweep()
    keep = (c != BUDGETS[1]) | (n > np.sort(n[c == BUDGETS[1]])[-3])
    with pytest.raises(ValueError, match="3 distinct sizes"):
        fit_isoflop_profiles(c[keep], n[keep], loss[keep], flops_per_token=six_n)


def test_isoflop_profiles_name_a_budget_whose_parabola_opens_downward():
    c, n, _, loss = sweep()
    at = c == BUDGETS[2]
    loss[at] = 5.0 - 0.1 * (np.log(n[at]) - np.log(n[at]).mean()) ** 2
    with pytest.raises(ValueError, match=r"budget C=1\.6e\+16: .*opens downward.*do not bracket"):
        fit_isoflop_profiles(c, n, loss, flops_per_token=six_n)


def test_isoflop_profiles_refuse_a_minimum_outside_the_sizes():
    c, n, _, loss = sweep()
    at = c == BUDGETS[0]
    loss[at] = 5.0 + 0.1 * (np.log(n[at]) - np.log(n[at]).max() - 1.0) ** 2
    with pytest.raises(ValueError, match=r"budget C=1e\+15: .*outside its sizes"):
        fit_isoflop_profiles(c, n, loss, flops_per_token=six_n)


def test_bootstrap_needs_a_residual_for_a_and_b():
    c, n, d, loss = sweep(sizes_per_budget=3)
    with pytest.raises(ValueError, match="every budget has exactly 3 runs"):
        bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=10)


def test_non_positive_values_are_named():
    c, n, d, loss = sweep()
    n[2] = 0.0
    with pytest.raises(ValueError, match=r"n_params\[2\]=0.0 must be positive"):
        fit_loss_law(n, d, loss)
    loss[3] = -1.0
    with pytest.raises(ValueError, match=r"loss\[3\]=-1.0"):
        fit_isoflop_profiles(c, np.abs(n) + 1, loss, flops_per_token=six_n)


def test_bad_shapes_and_counts():
    c, n, d, loss = sweep()
    with pytest.raises(ValueError, match="one value per run"):
        fit_loss_law(n, d[:-1], loss)
    with pytest.raises(ValueError, match="at least 5 runs"):
        fit_loss_law(n[:4], d[:4], loss[:4])
    with pytest.raises(ValueError, match="resamples=5"):
        bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=5)
    with pytest.raises(ValueError, match="compute=0"):
        TRUTH.optimum(0)
    with pytest.raises(ValueError, match="no compute-optimal point"):
        TRUTH.model_copy(update={"beta": -0.1}).optimum(1e18)


# ----------------------------------------------------------------------------- model family


def test_family_depth_12_is_the_gpt124m_shape():
    assert family_config(12, vocab_size=50304, max_seq_len=1024) == model_config("gpt124m", vocab_size=50304)


def test_family_members_count_params_and_flops_with_models_flops():
    members = family_members(range(1, 9), vocab_size=4096, max_seq_len=256)
    assert [m.depth for m in members] == list(range(1, 9))
    assert all(a.n_params < b.n_params for a, b in zip(members, members[1:]))
    for m in members:
        assert m.config.dim == 64 * m.depth and m.config.head_dim == 64
        assert m.n_params == num_params(m.config)
        assert m.flops_per_token == flops_per_token(m.config, 256)
    per_token = flops_per_token_of(members)
    assert per_token(members[3].n_params) == pytest.approx(members[3].flops_per_token)
    assert members[3].flops_per_token < per_token(math.sqrt(members[3].n_params * members[4].n_params)) \
        < members[4].flops_per_token


def test_plan_isoflop_runs_spends_the_budget_on_each_size():
    members = family_members(range(1, 9), vocab_size=4096, max_seq_len=256)
    runs = plan_isoflop_runs(1e15, [4e5, 1e6, 3e6, 8e6], members)
    assert [r.depth for r in runs] == [1, 2, 3, 5]
    for r in runs:
        assert r.tokens * r.flops_per_token <= 1e15 < (r.tokens + 1) * r.flops_per_token


def test_plan_isoflop_runs_refuses_what_it_cannot_train():
    members = family_members(range(1, 9), vocab_size=4096, max_seq_len=256)
    with pytest.raises(ValueError, match="both round to depth 2"):
        plan_isoflop_runs(1e15, [9e5, 1e6], members)
    with pytest.raises(ValueError, match="outside the family"):
        plan_isoflop_runs(1e15, [1e9], members)
    with pytest.raises(ValueError, match="less than one sequence"):
        plan_isoflop_runs(1e9, [1e6], members)
    with pytest.raises(ValueError, match="multiple of head_dim"):
        family_config(4, vocab_size=4096, max_seq_len=256, aspect_ratio=48)


def test_a_diverged_fit_is_an_error_and_a_resample_that_diverges_is_left_out(monkeypatch):
    from models import scaling, scaling_bootstrap

    # The tiny sweep of 2026-12-06: one resample's L-BFGS left ln A past 700, and exp() overflowed, ending the flow.
    with pytest.raises(ValueError, match="approach 3 diverged"):
        scaling._law(np.array([900.0, 1.0, 0.0, 0.3, 0.3]))
    c, n, d, loss = sweep(sizes_per_budget=4, noise=0.002, seed=3, budgets=BUDGETS[:3])
    calls = []
    real = scaling_bootstrap.fit_loss_law

    def every_third_diverges(*args, start=None):
        calls.append(start)
        if start is not None and len(calls) % 3 == 0:
            raise ValueError("approach 3 diverged")
        return real(*args, start=start)

    monkeypatch.setattr(scaling_bootstrap, "fit_loss_law", every_third_diverges)
    sb = bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=12, seed=0)
    assert len(sb.laws) == 8  # 4 of the 12 resamples left out, the rest give the intervals
    monkeypatch.setattr(scaling_bootstrap, "fit_loss_law", lambda *a, start=None: (
        real(*a) if start is None else (_ for _ in ()).throw(ValueError("approach 3 diverged"))))
    with pytest.raises(ValueError, match="could be fitted by approach 3"):
        bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=12, seed=0)
