"""Paired differences over seeds and windows: coverage under no difference, a planted difference caught, directions."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.eval.seed_differences import (bits_per_byte, bpb_difference, mean_bpb, mean_bpb_difference, value_difference,
                                          verdict)


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


def test_the_targets_mean_pairs_each_target_on_its_own_windows():
    rng = np.random.default_rng(4)
    easy, hard = rng.normal(1.0, 0.2, 40), rng.normal(3.0, 0.3, 70)

    def scored(shift_easy: float, shift_hard: float) -> list[dict[str, np.ndarray]]:
        return [{"easy": e, "hard": h} for e, h in zip(runs(rng, easy, 3, shift_easy), runs(rng, hard, 3, shift_hard))]

    d = mean_bpb_difference(scored(0.2, 0.0), scored(0.0, 0.0))  # one of two targets 0.2 worse: the mean 0.1 worse
    assert d.verdict == "worse" and d.diff == pytest.approx(0.1, abs=0.04) and d.windows == 110
    one = bpb_difference([s["easy"] for s in scored(0.0, 0.0)], [s["easy"] for s in scored(0.0, 0.0)], seed=3)
    assert one.verdict == "indistinguishable"
    assert mean_bpb({"a": np.array([[math.log(2) * 100, 100.0]]), "b": np.array([[math.log(2) * 300, 100.0]])}) == 2.0
    with pytest.raises(ValueError, match="same targets"):
        mean_bpb_difference([{"a": easy}], [{"b": easy}])
