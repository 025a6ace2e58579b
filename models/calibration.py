"""Calibration metrics: does a model's confidence match how often it is right?

Everything here takes a *confidence* (the probability the model gave to its own
top-1 prediction, in [0, 1]) and a *correct* flag per prediction, so the same code
serves next-token predictions and whole answers.

Conventions (chosen to agree with torchmetrics' ``BinaryCalibrationError``):
- equal-width ("uniform") bins are left-closed ``[lo, hi)``; the last bin also holds 1.0;
- equal-mass ("quantile") bins split the predictions sorted by confidence into
  ``n_bins`` runs of (almost) equal size, so ties may straddle a boundary;
- ECE is the count-weighted mean of |accuracy - mean confidence| over bins, MCE the max
  over non-empty bins.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel

BinStrategy = Literal["uniform", "quantile"]

_EPS = 1e-12


class ReliabilityBins(BaseModel):
    """Per-bin summary behind a reliability diagram; empty bins have count 0 and None means (JSON-safe)."""

    strategy: BinStrategy
    edges: list[float]  # n_bins + 1 boundaries
    mean_confidence: list[float | None]
    accuracy: list[float | None]
    counts: list[int]

    @property
    def n(self) -> int:
        return int(sum(self.counts))


class CalibrationReport(BaseModel):
    """All calibration numbers of one set of predictions.

    `nll` and `brier` score the top-1 confidence as a probability of being correct
    (binary log loss and binary Brier). `temperature` and the two held-out ECEs are
    filled when temperature scaling was fitted: `ece_heldout` is the ECE before scaling
    and `ece_after_temperature` after, both on predictions not used for the fit.
    """

    n: int
    accuracy: float
    ece: float
    ece_equal_mass: float
    mce: float
    brier: float
    nll: float
    temperature: float | None = None
    ece_heldout: float | None = None
    ece_after_temperature: float | None = None
    # 95% intervals, filled where the predictions are independent (answers, not tokens):
    # Wilson for the accuracy, percentile bootstrap for the two ECEs and the Brier score (tasks/eval/intervals.py).
    accuracy_lo: float | None = None
    accuracy_hi: float | None = None
    ece_lo: float | None = None
    ece_hi: float | None = None
    ece_equal_mass_lo: float | None = None
    ece_equal_mass_hi: float | None = None
    brier_lo: float | None = None  # percentile bootstrap over the predictions
    brier_hi: float | None = None


def prediction_arrays(confidences, correct, probabilities: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Flat float64 (confidence, correct) arrays, checked: the same length, non-empty, confidences finite
    (and in [0, 1] when `probabilities`, as every calibration metric needs), correct only 0/1."""
    conf = _to_numpy(confidences).astype(np.float64).reshape(-1)
    corr = _to_numpy(correct).astype(np.float64).reshape(-1)
    if conf.shape != corr.shape:
        raise ValueError(
            f"confidences ({conf.size} values) and correct ({corr.size} values) must have the same length"
        )
    if conf.size == 0:
        raise ValueError("need non-empty confidences and correct (at least one prediction); got empty ones")
    if probabilities and (not np.all(np.isfinite(conf)) or conf.min() < 0.0 or conf.max() > 1.0):
        raise ValueError(
            "confidences must be probabilities in [0, 1]; got values in "
            f"[{np.nanmin(conf):.4g}, {np.nanmax(conf):.4g}] (apply softmax to logits first)"
        )
    if not np.all(np.isfinite(conf)):
        raise ValueError("confidences must be finite numbers")
    if not np.all((corr == 0.0) | (corr == 1.0)):
        raise ValueError("correct must hold only 0/1 (or booleans)")
    return conf, corr


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x)


def _bin_index(conf: np.ndarray, n_bins: int, strategy: BinStrategy) -> tuple[np.ndarray, np.ndarray]:
    """Bin of each prediction and the bin edges."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        idx = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, n_bins - 1)
        return idx, edges
    if strategy == "quantile":
        n_bins = min(n_bins, conf.size)
        order = np.argsort(conf, kind="stable")
        # Rank-based split gives exactly equal mass even when many confidences tie.
        idx = np.empty(conf.size, dtype=np.int64)
        idx[order] = (np.arange(conf.size) * n_bins) // conf.size
        sorted_conf = conf[order]
        starts = np.searchsorted(idx[order], np.arange(1, n_bins))
        inner = (sorted_conf[starts - 1] + sorted_conf[starts]) / 2.0
        edges = np.concatenate([[0.0], inner, [1.0]])
        return idx, edges
    raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")


def reliability_bins(
    confidences, correct, n_bins: int = 15, strategy: BinStrategy = "uniform"
) -> ReliabilityBins:
    """Mean confidence, accuracy and count per confidence bin."""
    conf, corr = prediction_arrays(confidences, correct)
    idx, edges = _bin_index(conf, n_bins, strategy)
    k = len(edges) - 1
    counts = np.bincount(idx, minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=k) / counts
        acc = np.bincount(idx, weights=corr, minlength=k) / counts
    empty = counts == 0
    return ReliabilityBins(
        strategy=strategy,
        edges=edges.tolist(),
        mean_confidence=[None if e else float(v) for e, v in zip(empty, mean_conf)],
        accuracy=[None if e else float(v) for e, v in zip(empty, acc)],
        counts=counts.astype(int).tolist(),
    )


def _gaps(bins: ReliabilityBins) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(bins.counts, dtype=np.float64)
    nonempty = counts > 0
    acc = np.asarray(bins.accuracy, dtype=np.float64)  # None (empty bin) becomes NaN
    conf = np.asarray(bins.mean_confidence, dtype=np.float64)
    gap = np.abs(acc[nonempty] - conf[nonempty])
    return gap, counts[nonempty]


def ece_from_bins(bins: ReliabilityBins) -> float:
    """Expected calibration error of already-computed bins."""
    gap, counts = _gaps(bins)
    return float(np.sum(gap * counts) / counts.sum())


def mce_from_bins(bins: ReliabilityBins) -> float:
    """Maximum calibration error (largest gap over non-empty bins) of already-computed bins."""
    gap, _ = _gaps(bins)
    return float(gap.max())


def ece_rows(confidences: np.ndarray, correct: np.ndarray, n_bins: int = 15,
             strategy: BinStrategy = "uniform") -> np.ndarray:
    """ECE of each row of [R, N] arrays at once (e.g. bootstrap resamples), binned exactly as `ece` bins one row."""
    conf = np.asarray(confidences, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.ndim != 2 or conf.shape != corr.shape or conf.shape[1] == 0:
        raise ValueError(f"confidences and correct must be equal [R, N] arrays with N >= 1; got {conf.shape} and {corr.shape}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    rows, n = conf.shape
    if strategy == "uniform":
        k = n_bins
        idx = np.clip(np.searchsorted(np.linspace(0.0, 1.0, k + 1), conf, side="right") - 1, 0, k - 1)
    elif strategy == "quantile":
        k = min(n_bins, n)
        idx = np.empty((rows, n), dtype=np.int64)
        np.put_along_axis(idx, np.argsort(conf, axis=1, kind="stable"), (np.arange(n) * k // n)[None, :], axis=1)
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    flat = (idx + k * np.arange(rows)[:, None]).reshape(-1)
    # count * |accuracy - mean confidence| of a bin is |sum(correct) - sum(confidence)| over it.
    gap = np.bincount(flat, weights=(corr - conf).reshape(-1), minlength=rows * k).reshape(rows, k)
    return np.abs(gap).sum(axis=1) / n


def ece(confidences, correct, n_bins: int = 15, strategy: BinStrategy = "uniform") -> float:
    """Expected calibration error: count-weighted mean |accuracy - confidence| over bins."""
    return ece_from_bins(reliability_bins(confidences, correct, n_bins, strategy))


def mce(confidences, correct, n_bins: int = 15, strategy: BinStrategy = "uniform") -> float:
    """Maximum calibration error: the worst bin's |accuracy - confidence|."""
    return mce_from_bins(reliability_bins(confidences, correct, n_bins, strategy))


def brier(confidences, correct) -> float:
    """Binary Brier score of the top-1 confidence: mean (confidence - correct)^2."""
    conf, corr = prediction_arrays(confidences, correct)
    return float(np.mean((conf - corr) ** 2))


def binary_nll(confidences, correct) -> float:
    """Log loss of the top-1 confidence read as P(correct); clipped so 0/1 confidences stay finite."""
    conf, corr = prediction_arrays(confidences, correct)
    p = np.clip(conf, _EPS, 1.0 - _EPS)
    return float(-np.mean(corr * np.log(p) + (1.0 - corr) * np.log1p(-p)))


def nll(probs_of_true) -> float:
    """Mean negative log-likelihood given the probability each prediction gave to the true label."""
    p = _to_numpy(probs_of_true).astype(np.float64).reshape(-1)
    if p.size == 0 or np.any(p < 0) or np.any(p > 1):
        raise ValueError("probs_of_true must be a non-empty array of probabilities in [0, 1]")
    return float(-np.mean(np.log(np.clip(p, _EPS, 1.0))))


def top1_from_logits(logits, labels, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 confidence and correctness of each row of `logits` [N, C] at a temperature."""
    z, y = _logits_labels(logits, labels)
    confs, correct = [], []
    for start in range(0, z.shape[0], _CHUNK):
        zc = z[start : start + _CHUNK].float() / temperature
        p = torch.softmax(zc, dim=-1)
        conf, pred = p.max(dim=-1)
        confs.append(conf.double())
        correct.append(pred == y[start : start + _CHUNK])
    return torch.cat(confs).numpy(), torch.cat(correct).numpy()


# Rows per chunk when scanning large logit matrices (e.g. tokens x vocab) in float32.
_CHUNK = 4096


def _logits_labels(logits, labels) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits if isinstance(logits, torch.Tensor) else torch.as_tensor(np.asarray(logits))
    y = labels if isinstance(labels, torch.Tensor) else torch.as_tensor(np.asarray(labels))
    z, y = z.detach().cpu(), y.detach().cpu().long().reshape(-1)
    if z.ndim != 2 or z.shape[0] != y.numel():
        raise ValueError(
            f"logits must be [N, C] and labels [N]; got logits {tuple(z.shape)} and labels {tuple(y.shape)}"
        )
    if y.numel() == 0:
        raise ValueError("need at least one (logits, label) pair")
    if y.min() < 0 or y.max() >= z.shape[1]:
        raise ValueError(f"labels must lie in [0, {z.shape[1]}); got [{int(y.min())}, {int(y.max())}]")
    return z, y


def _nll_sum(z: torch.Tensor, y: torch.Tensor, beta: float) -> float:
    """Sum of cross-entropy at inverse temperature `beta`, in float32 chunks to bound memory."""
    total = 0.0
    for start in range(0, z.shape[0], _CHUNK):
        zc = z[start : start + _CHUNK].float() * beta
        total += float(
            torch.nn.functional.cross_entropy(zc, y[start : start + _CHUNK], reduction="sum")
        )
    return total


def fit_temperature(
    logits, labels, t_min: float = 0.05, t_max: float = 20.0, tol: float = 1e-4, max_iter: int = 100
) -> float:
    """Temperature T minimising the NLL of softmax(logits / T) on (logits [N, C], labels [N]).

    NLL is convex in the inverse temperature 1/T, hence unimodal in log T, so a
    golden-section search over log T on [t_min, t_max] finds the optimum without
    gradients and stays within the bounds. Logits may be float16 to save memory.
    """
    if not 0 < t_min < t_max:
        raise ValueError(f"need 0 < t_min < t_max, got t_min={t_min}, t_max={t_max}")
    z, y = _logits_labels(logits, labels)
    lo, hi = math.log(t_min), math.log(t_max)
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0

    def loss(log_t: float) -> float:
        return _nll_sum(z, y, math.exp(-log_t))

    a, b = lo + (1 - inv_phi) * (hi - lo), lo + inv_phi * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(max_iter):
        if hi - lo < tol:
            break
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - inv_phi) * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + inv_phi * (hi - lo)
            fb = loss(b)
    return float(math.exp((lo + hi) / 2.0))


def calibration_report(confidences, correct, n_bins: int = 15) -> CalibrationReport:
    """Every calibration number of one set of (confidence, correct) predictions."""
    conf, corr = prediction_arrays(confidences, correct)
    uniform = reliability_bins(conf, corr, n_bins, "uniform")
    return CalibrationReport(
        n=int(conf.size),
        accuracy=float(corr.mean()),
        ece=ece_from_bins(uniform),
        ece_equal_mass=ece(conf, corr, n_bins, "quantile"),
        mce=mce_from_bins(uniform),
        brier=brier(conf, corr),
        nll=binary_nll(conf, corr),
    )
