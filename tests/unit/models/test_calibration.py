"""Calibration metrics against torchmetrics, closed-form cases and synthetic temperatures."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.classification import BinaryCalibrationError, MulticlassCalibrationError

from models.calibration import (binary_nll, brier, calibration_report, ece, fit_temperature, mce, nll, reliability_bins,
                                top1_from_logits)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("n_bins", [5, 10, 15])
@pytest.mark.parametrize("seed", [0, 1])
def test_ece_and_mce_match_torchmetrics_binary(n_bins: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.0, 1.0, 5000) ** 0.5  # skewed towards high confidence, like a model
    correct = rng.uniform(size=conf.size) < conf**2  # overconfident
    preds, target = torch.tensor(conf), torch.tensor(correct.astype(np.int64))
    ref_ece = BinaryCalibrationError(n_bins=n_bins, norm="l1")(preds, target).item()
    ref_mce = BinaryCalibrationError(n_bins=n_bins, norm="max")(preds, target).item()
    assert ece(conf, correct, n_bins) == pytest.approx(ref_ece, abs=1e-9)
    assert mce(conf, correct, n_bins) == pytest.approx(ref_mce, abs=1e-9)
    assert ref_ece > 0.05  # the data is really miscalibrated, so agreement is not trivial


def test_ece_matches_torchmetrics_multiclass_from_logits() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4000, 7, generator=gen, dtype=torch.float64) * 3.0
    labels = torch.randint(0, 7, (4000,), generator=gen)
    conf, correct = top1_from_logits(logits, labels)
    probs = torch.softmax(logits, dim=-1)
    for norm, ours in (("l1", ece(conf, correct, 10)), ("max", mce(conf, correct, 10))):
        ref = MulticlassCalibrationError(num_classes=7, n_bins=10, norm=norm)(probs, labels).item()
        assert ours == pytest.approx(ref, abs=1e-6)
    assert correct.mean() == pytest.approx((probs.argmax(-1) == labels).double().mean().item())


def test_perfectly_calibrated_predictions_have_near_zero_ece() -> None:
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.0, 1.0, 200_000)
    correct = rng.uniform(size=conf.size) < conf
    assert ece(conf, correct, 15) < 0.01
    assert ece(conf, correct, 15, "quantile") < 0.01
    assert mce(conf, correct, 15) < 0.03


def test_badly_calibrated_predictions_have_the_known_error() -> None:
    # Always 90% sure, right half the time: gap 0.4 in the only occupied bin.
    conf = np.full(1000, 0.9)
    correct = np.arange(1000) % 2 == 0
    assert ece(conf, correct) == pytest.approx(0.4)
    assert ece(conf, correct, strategy="quantile") == pytest.approx(0.4)
    assert mce(conf, correct) == pytest.approx(0.4)
    report = calibration_report(conf, correct)
    assert report.accuracy == pytest.approx(0.5)
    assert report.brier == pytest.approx(0.5 * 0.1**2 + 0.5 * 0.9**2)
    assert report.nll == pytest.approx(-(0.5 * math.log(0.9) + 0.5 * math.log(0.1)))
    assert report.n == 1000


def test_two_bin_example_by_hand() -> None:
    conf = [0.2, 0.3, 0.6, 0.8, 0.9]
    correct = [0, 1, 1, 1, 0]
    bins = reliability_bins(conf, correct, n_bins=2)
    assert bins.counts == [2, 3]
    assert bins.mean_confidence == pytest.approx([0.25, 2.3 / 3])
    assert bins.accuracy == pytest.approx([0.5, 2 / 3])
    expected = (2 * 0.25 + 3 * abs(2 / 3 - 2.3 / 3)) / 5
    assert ece(conf, correct, 2) == pytest.approx(expected)
    assert mce(conf, correct, 2) == pytest.approx(0.25)


def test_quantile_bins_hold_equal_mass_and_ordered_edges() -> None:
    rng = np.random.default_rng(1)
    conf = rng.beta(5, 1, 1003)
    correct = rng.uniform(size=conf.size) < 0.5
    bins = reliability_bins(conf, correct, 10, "quantile")
    assert sum(bins.counts) == 1003
    assert max(bins.counts) - min(bins.counts) <= 1
    assert np.all(np.diff(bins.edges) >= 0)
    means = np.asarray(bins.mean_confidence)
    assert np.all(np.diff(means) > 0)  # bins follow confidence order
    # Uniform bins on beta(5,1) leave low bins nearly empty; quantile bins never do.
    assert min(reliability_bins(conf, correct, 10).counts) < 5


def test_confidence_of_one_lands_in_last_uniform_bin() -> None:
    bins = reliability_bins([1.0, 0.0, 0.5], [1, 0, 1], n_bins=4)
    assert bins.counts == [1, 0, 1, 1]
    assert bins.accuracy == [0.0, None, 1.0, 1.0]  # empty bins are None, so the bins survive JSON
    assert type(bins).model_validate_json(bins.model_dump_json()) == bins


def test_brier_and_nll_by_hand() -> None:
    assert brier([0.8, 0.3], [1, 0]) == pytest.approx((0.2**2 + 0.3**2) / 2)
    assert binary_nll([0.8, 0.3], [1, 0]) == pytest.approx(-(math.log(0.8) + math.log(0.7)) / 2)
    assert nll([0.5, 0.25]) == pytest.approx((math.log(2) + math.log(4)) / 2)


def test_temperature_scaling_recovers_known_temperature_and_lowers_ece() -> None:
    gen = torch.Generator().manual_seed(0)
    n, c, true_t = 40_000, 10, 2.5
    calibrated = torch.randn(n, c, generator=gen) * 2.0
    labels = torch.multinomial(torch.softmax(calibrated, -1), 1, generator=gen).squeeze(1)
    overconfident = calibrated * true_t  # softmax(overconfident / 2.5) is the true distribution
    fit, held = slice(0, n // 2), slice(n // 2, n)
    t = fit_temperature(overconfident[fit], labels[fit])
    assert t == pytest.approx(true_t, rel=0.05)

    def nll_at(temperature: float) -> float:  # the mean NLL of the fit half, by torch's own cross-entropy
        return torch.nn.functional.cross_entropy(overconfident[fit] / temperature, labels[fit]).item()

    assert nll_at(t) <= min(nll_at(1.0), nll_at(t * 0.95), nll_at(t * 1.05))  # t minimises it
    before = ece(*top1_from_logits(overconfident[held], labels[held]))
    after = ece(*top1_from_logits(overconfident[held], labels[held], temperature=t))
    assert before > 0.1
    assert after < 0.02
    # float16 storage (what evaluation keeps in memory) gives the same answer.
    assert fit_temperature(overconfident[fit].half(), labels[fit]) == pytest.approx(t, rel=0.01)


def test_temperature_stays_within_bounds() -> None:
    logits = torch.tensor([[5.0, 0.0], [5.0, 0.0]])
    labels = torch.tensor([0, 0])  # always right: NLL keeps falling as T -> 0
    assert fit_temperature(logits, labels, t_min=0.1, t_max=10.0) == pytest.approx(0.1, rel=0.01)


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="same length"):
        ece([0.5, 0.5], [1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ece([1.5], [1])
    with pytest.raises(ValueError, match="0/1"):
        brier([0.5], [2])
    with pytest.raises(ValueError, match="empty"):
        ece([], [])
    with pytest.raises(ValueError, match="strategy"):
        ece([0.5], [1], strategy="log")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="labels"):
        fit_temperature(torch.zeros(2, 3), torch.tensor([0, 3]))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=200),
    st.integers(1, 20),
    st.sampled_from(["uniform", "quantile"]),
)
def test_metric_ranges(pairs, n_bins, strategy) -> None:
    conf = [p for p, _ in pairs]
    correct = [c for _, c in pairs]
    e, m = ece(conf, correct, n_bins, strategy), mce(conf, correct, n_bins, strategy)
    assert 0.0 <= e <= m + 1e-12 <= 1.0 + 1e-12
    bins = reliability_bins(conf, correct, n_bins, strategy)
    assert bins.n == len(pairs)
    assert 0.0 <= brier(conf, correct) <= 1.0
