"""Figures are real, readable PNGs that depend on their data, written without leftovers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from models.calibration import calibration_report, reliability_bins
from tasks.eval.selective import selective_report
from tasks.reports.plots import (accuracy_coverage_png, compare_models_png, funnel_figure, funnel_png,
                                 reliability_diagram_png)
from tasks.training.loss_curve import loss_curve_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_png(path: Path) -> np.ndarray:
    assert path.is_file() and path.stat().st_size > 5_000
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
    assert img[..., :3].std() > 0.05  # not a blank canvas
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    return img


def _predictions(seed: int, overconfidence: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.1, 1.0, 3000)
    correct = rng.uniform(size=conf.size) < conf**overconfidence
    return conf, correct


def test_reliability_diagram_depends_on_data(tmp_path: Path) -> None:
    a = reliability_bins(*_predictions(0, 1.0), n_bins=10)
    b = reliability_bins(*_predictions(0, 3.0), n_bins=10)
    img_a = _check_png(reliability_diagram_png(a, tmp_path / "a.png", "calibrated", ece=0.01))
    img_b = _check_png(reliability_diagram_png(b, tmp_path / "b.png", "calibrated", ece=0.01))
    assert img_a.shape != img_b.shape or not np.array_equal(img_a, img_b)
    q = reliability_bins(*_predictions(0, 2.0), n_bins=10, strategy="quantile")
    _check_png(reliability_diagram_png(q, tmp_path / "sub" / "q.png", "equal mass", ece=0.1, ece_interval=(0.08, 0.12)))
    # A few answers in uneven bins (counts and intervals drawn), and the title says how the bins were made.
    conf, correct = _predictions(2, 1.5)
    few = reliability_bins(conf[:40], correct[:40], n_bins=15)
    assert min(c for c in few.counts if c) < 3
    _check_png(reliability_diagram_png(few, tmp_path / "few.png", "40 answers", ece=0.2))
    from tasks.reports.plots import _bins_note

    assert _bins_note(q) == "10 equal-mass bins of 300" and _bins_note(few) == "15 equal-width bins"


def test_accuracy_coverage_curves(tmp_path: Path) -> None:
    curves = {}
    for name, k in (("sft", 1.0), ("grpo", 3.0)):
        conf, correct = _predictions(3, k)
        curves[name] = selective_report(conf, correct, target_accuracy=0.8)
    assert curves["sft"].coverage_at_target is not None
    _check_png(accuracy_coverage_png(curves, tmp_path / "coverage.png"))
    with pytest.raises(ValueError, match="at least one curve"):
        accuracy_coverage_png({}, tmp_path / "none.png")


def test_compare_models(tmp_path: Path) -> None:
    reports = {}
    for name, k in (("base", 3.0), ("sft", 1.5), ("grpo", 1.0)):
        conf, correct = _predictions(1, k)
        reports[name] = (calibration_report(conf, correct, 10), reliability_bins(conf, correct, 10))
    _check_png(compare_models_png(reports, tmp_path / "compare.png"))
    with pytest.raises(ValueError, match="at least one"):
        compare_models_png({}, tmp_path / "none.png")


def test_loss_curve_shared_and_own_steps(tmp_path: Path) -> None:
    steps = list(range(100))
    train = [5.0 * np.exp(-s / 30) + 1 for s in steps]
    _check_png(loss_curve_png(steps, {"train": train}, tmp_path / "loss.png", "pretrain"))
    own = {"train": steps, "val": [0, 50, 99]}
    _check_png(loss_curve_png(own, {"train": train, "val": [6.0, 2.0, 1.5]}, tmp_path / "l2.png", log_y=True))
    with pytest.raises(ValueError, match="'val' has 2 values but 100 steps"):
        loss_curve_png(steps, {"val": [1.0, 2.0]}, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def _assert_legends_clear_of_bars(fig) -> None:
    """Every axes' legend lies outside its own axes and every axes' bars (the funnel's bars fill their axes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
        for other in fig.axes:
            assert not any(box.overlaps(bar.get_window_extent(renderer)) for bar in other.patches), ax.get_title()


def test_funnel_chart(tmp_path: Path) -> None:
    funnel = {
        "wiki": {"collected": 100, "rejected": 2, "exact_duplicates": 10, "near_duplicates": 5,
                 "filtered": 13, "kept": 70, "filtered:gopher_short": 13, "rejected:bad_utf8": 2},
        "code": {"collected": 50, "rejected": 0, "exact_duplicates": 1, "near_duplicates": 0,
                 "filtered": 4, "kept": 45, "filtered:gopher_short": 1, "filtered:symbol_ratio": 3},
    }
    _check_png(funnel_png(funnel, tmp_path / "funnel.png"))
    _check_png(funnel_png({"x": {"in": 5, "out": 3}}, tmp_path / "generic.png"))
    for data in (funnel, {"x": {"in": 5, "out": 3}}):
        _assert_legends_clear_of_bars(funnel_figure(data))
    with pytest.raises(ValueError, match="empty funnel"):
        funnel_png({}, tmp_path / "e.png")
