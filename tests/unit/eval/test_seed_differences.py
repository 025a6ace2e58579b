"""Paired differences over seeds and windows: coverage under no difference, a planted difference caught, directions."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.eval.seed_differences import bits_per_byte, bpb_difference, value_difference, verdict


def runs(rng, difficulty, seeds: int, shift: float = 0.0, seed_sd: float = 0.02, noise_sd: float = 0.01):
    """Each seed's [windows, (nats, bytes)] on windows of the given difficulty (bpb), offset by a seed effect."""
    n = len(difficulty)
    out = []
    for _ in range(seeds):
        n_bytes = np.full(n, 500.0)
        bpb = difficulty + shift + rng.normal(0, seed_sd) + rng.normal(0, noise_sd, n)
        out.append(np.stack([bpb * n_bytes * math.log(2), n_bytes], axis=1))
    return out


def test_bits_per_byte_sums_nats_over_bytes():
    assert bits_per_byte(np.array([[math.log(2) * 100, 50.0], [math.log(2) * 50, 50.0]])) == pytest.approx(1.5)


def test_no_difference_is_indistinguishable_about_as_often_as_the_level_says():
    rng = np.random.default_rng(0)
    said = []
    for trial in range(200):
        difficulty = rng.normal(2.0, 0.3, 60)
        d = bpb_difference(runs(rng, difficulty, 3), runs(rng, difficulty, 3), resamples=400, seed=trial)
        said.append(d.verdict)
    assert said.count("indistinguishable") >= 180  # 95% intervals: about 190 expected


def test_a_planted_difference_is_caught_with_its_sign():
    rng = np.random.default_rng(1)
    difficulty = rng.normal(2.0, 0.3, 60)
    worse = bpb_difference(runs(rng, difficulty, 3, shift=0.15), runs(rng, difficulty, 3))
    assert worse.verdict == "worse" and worse.ci[0] > 0 and worse.diff == pytest.approx(0.15, abs=0.06)
    better = bpb_difference(runs(rng, difficulty, 3, shift=-0.15), runs(rng, difficulty, 3))
    assert better.verdict == "better" and better.ci[1] < 0
    assert worse.seeds == 3 and worse.windows == 60


def test_one_seed_counts_the_windows_only_and_says_so():
    rng = np.random.default_rng(2)
    difficulty = rng.normal(2.0, 0.3, 40)
    d = bpb_difference(runs(rng, difficulty, 1), runs(rng, difficulty, 1))
    assert d.note and "one seed" in d.note and d.ci[0] < d.diff < d.ci[1]


def test_runs_must_pair_by_seed_and_window():
    rng = np.random.default_rng(3)
    with pytest.raises(ValueError, match="paired by seed"):
        bpb_difference(runs(rng, np.ones(5), 2), runs(rng, np.ones(5), 3))
    with pytest.raises(ValueError, match="same windows"):
        bpb_difference(runs(rng, np.ones(5), 2), runs(rng, np.ones(6), 2))


def test_a_metric_per_seed_has_its_direction():
    up = value_difference([0.61, 0.63, 0.62], [0.50, 0.52, 0.51], higher_is_better=True)
    assert up.verdict == "better" and up.diff == pytest.approx(0.11) and up.seed_only
    assert value_difference([0.61, 0.63, 0.62], [0.50, 0.52, 0.51], higher_is_better=False).verdict == "worse"
    assert value_difference([0.5], [0.4], higher_is_better=True).verdict == "indistinguishable"
    assert verdict((-0.1, 0.2), lower_is_better=True) == "indistinguishable"


def test_a_seed_without_the_metric_is_left_out_of_the_pairs():
    import math

    from tasks.eval.seed_differences import value_difference

    d = value_difference([1.0, 2.0, math.nan], [0.0, 0.0, 0.0], higher_is_better=True)
    assert d.seeds == 2 and d.diff == 1.5 and "1 seed pair(s)" in d.note
    assert value_difference([1.0, 2.0], [0.0, 0.0], higher_is_better=True).note is None
    none = value_difference([math.nan], [0.0], higher_is_better=True)
    assert none.seeds == 0 and math.isnan(none.diff) and none.verdict == "indistinguishable"
