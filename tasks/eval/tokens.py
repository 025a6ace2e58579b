"""Next-token metrics of a model on a token stream: loss, perplexity, bits per byte, accuracy, calibration.

The stream is cut into consecutive windows of `seq_len` predictions (the first `max_tokens`);
every prediction is scored once. Bits per byte (models/bpb.py) counts the UTF-8 bytes of the
predicted tokens, special tokens excluded, so that models with different tokenizers compare.
The predictions of one window share their context, so the intervals of perplexity, bits per
byte and the Brier score resample windows, not tokens (tasks/eval/intervals.bootstrap_ratio_interval);
the ECEs get none here. A temperature is fitted on one random part of the predictions
and judged on the other.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from models.bpb import LN2, bits_per_byte, nats_and_bytes
from models.calibration import calibration_report, ece, fit_temperature, reliability_bins, top1_from_logits
from models.llama import Transformer
from tasks.eval.config import EvalConfig
from tasks.eval.intervals import bootstrap_ratio_interval


def _windows(n_pred: int, seq_len: int) -> list[tuple[int, int]]:
    """(start, length) of consecutive windows covering predictions 0..n_pred-1."""
    return [(s, min(seq_len, n_pred - s)) for s in range(0, n_pred, seq_len)]


def _batches(windows: list[tuple[int, int]], batch_size: int) -> list[list[tuple[int, int]]]:
    """Group windows into batches of equal length (only the last window can be shorter)."""
    full = [w for w in windows if w[1] == windows[0][1]]
    rest = [w for w in windows if w[1] != windows[0][1]]
    out = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    return out + ([rest] if rest else [])


@torch.inference_mode()
def _token_pass(model: Transformer, tokens: np.ndarray, n_pred: int, seq_len: int, cfg: EvalConfig, keep: np.ndarray,
                byte_table: np.ndarray | None = None, progress: Callable[[int, int], None] | None = None):
    """One pass over the windows: per window [nats, tokens, nats of text tokens, bytes] (the last two 0 without
    `byte_table`), top-1 confidence/correctness, and logits of the `keep` predictions."""
    device = next(model.parameters()).device
    vocab = model.cfg.vocab_size
    table = torch.from_numpy(byte_table).to(device) if byte_table is not None else None
    conf = np.empty(n_pred, dtype=np.float64)
    correct = np.empty(n_pred, dtype=bool)
    kept_logits = torch.empty(len(keep), vocab, dtype=torch.float16)
    kept_labels = torch.empty(len(keep), dtype=torch.long)
    sums = []
    offset = 0
    batches = _batches(_windows(n_pred, seq_len), cfg.batch_size)
    for done, batch in enumerate(batches, 1):
        length = batch[0][1]
        rows = np.stack([np.asarray(tokens[s : s + length + 1], dtype=np.int64) for s, _ in batch])
        x = torch.from_numpy(rows[:, :-1]).to(device)
        y = torch.from_numpy(rows[:, 1:]).to(device)
        logits = model(x).float()
        logp = torch.log_softmax(logits, dim=-1)
        nats = -logp.gather(-1, y[..., None]).squeeze(-1).double()  # [windows, length]
        row_nats = nats.sum(-1)
        zeros = torch.zeros_like(row_nats)
        text_nats, n_bytes = nats_and_bytes(nats, y, table, dim=-1) if table is not None else (zeros, zeros)
        sums.append(torch.stack([row_nats, zeros + length, text_nats, n_bytes.double()], dim=1))
        logits, logp, y = logits.flatten(0, 1), logp.flatten(0, 1), y.flatten()
        top_logp, pred = logp.max(dim=-1)
        n = y.numel()
        conf[offset : offset + n] = top_logp.exp().double().cpu().numpy()
        correct[offset : offset + n] = (pred == y).cpu().numpy()
        lo, hi = np.searchsorted(keep, [offset, offset + n])
        if hi > lo:
            local = torch.from_numpy(keep[lo:hi] - offset).to(device)
            kept_logits[lo:hi] = logits[local].half().cpu()
            kept_labels[lo:hi] = y[local].cpu()
        offset += n
        if progress is not None:
            progress(done, len(batches))
    return torch.cat(sums).cpu().numpy(), conf, correct, kept_logits, kept_labels


def _temperature_study(
    logits: torch.Tensor, labels: torch.Tensor, cfg: EvalConfig, rng: np.random.Generator
) -> tuple[float | None, float | None, float | None]:
    """(temperature, held-out ECE before, held-out ECE after), fitting on a random part of the kept predictions."""
    k = labels.numel()
    n_fit = int(round(k * cfg.temperature_fit_fraction))
    if n_fit < 1 or k - n_fit < 1:
        return None, None, None
    order = torch.from_numpy(rng.permutation(k))
    fit, held = order[:n_fit], order[n_fit:]
    t = fit_temperature(logits[fit], labels[fit])
    before = ece(*top1_from_logits(logits[held], labels[held]), n_bins=cfg.n_bins)
    after = ece(*top1_from_logits(logits[held], labels[held], temperature=t), n_bins=cfg.n_bins)
    return t, before, after


def loss_intervals(sums: np.ndarray, cfg: EvalConfig) -> dict:
    """Perplexity's and bits per byte's bootstrap intervals over the windows of `_token_pass`'s sums, and bits per
    byte itself where bytes were counted."""
    nats, n_tokens, text_nats, n_bytes = sums.T
    out: dict = {}
    several = len(sums) >= 2  # one window resamples to itself: no interval
    if several:
        lo, hi = bootstrap_ratio_interval(nats, n_tokens, cfg.bootstrap_resamples, cfg.seed)
        out.update(perplexity_lo=math.exp(lo), perplexity_hi=math.exp(hi))
    if n_bytes.sum() > 0:
        out.update(bpb=bits_per_byte(text_nats.sum(), int(n_bytes.sum())), n_bytes=int(n_bytes.sum()))
        if several:
            lo, hi = bootstrap_ratio_interval(text_nats, n_bytes, cfg.bootstrap_resamples, cfg.seed)
            out.update(bpb_lo=lo / LN2, bpb_hi=hi / LN2)
    return out


def brier_interval(conf: np.ndarray, correct: np.ndarray, seq_len: int, cfg: EvalConfig) -> dict:
    """The top-1 Brier score's bootstrap interval over the same windows as perplexity's (empty for one window)."""
    window = np.arange(conf.size) // seq_len  # the windows are consecutive runs of seq_len predictions
    if window[-1] < 1:
        return {}
    squared = np.bincount(window, weights=(conf - correct.astype(np.float64)) ** 2)
    lo, hi = bootstrap_ratio_interval(squared, np.bincount(window), cfg.bootstrap_resamples, cfg.seed)
    return {"brier_lo": lo, "brier_hi": hi}


def token_metrics(model: Transformer, val_tokens: np.ndarray, cfg: EvalConfig, byte_table: np.ndarray | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """Loss, perplexity, accuracy and calibration of next-token predictions on `val_tokens`; bits per byte too
    when given the tokenizer's `byte_table` (models.bpb.token_bytes). `progress(done, total)` after each batch."""
    n_pred = min(cfg.max_tokens, len(val_tokens) - 1)
    if n_pred < 1:
        raise ValueError(f"val_tokens holds {len(val_tokens)} tokens; need at least 2 to score one prediction")
    seq_len = min(cfg.seq_len or model.cfg.max_seq_len, model.cfg.max_seq_len)
    top = int(np.max(val_tokens[: n_pred + 1]))
    if top >= model.cfg.vocab_size:
        raise ValueError(
            f"val_tokens contain id {top} but the model's vocab_size is {model.cfg.vocab_size}; "
            "evaluate with the tokens made by this model's tokenizer"
        )
    rng = np.random.default_rng(cfg.seed)
    keep = np.sort(rng.choice(n_pred, size=min(n_pred, cfg.temperature_tokens), replace=False))
    was_training = model.training
    model.eval()
    try:
        sums, conf, correct, logits, labels = _token_pass(model, val_tokens, n_pred, seq_len, cfg, keep, byte_table, progress)
    finally:
        model.train(was_training)
    report = calibration_report(conf, correct, cfg.n_bins)
    t, before, after = _temperature_study(logits, labels, cfg, rng)
    report = report.model_copy(update={"temperature": t, "ece_heldout": before, "ece_after_temperature": after,
                                       **brier_interval(conf, correct, seq_len, cfg)})
    loss = float(sums[:, 0].sum()) / n_pred
    return {
        **loss_intervals(sums, cfg),
        "n_tokens": n_pred,
        "seq_len": seq_len,
        "val_loss": loss,
        "perplexity": math.exp(loss),
        "token_accuracy": float(correct.mean()),
        "token_calibration": report,
        "token_bins": reliability_bins(conf, correct, cfg.n_bins),
    }
