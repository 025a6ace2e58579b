"""Evaluation stage: validation loss and perplexity, and how well calibrated the model is.

Two levels:
- tokens: every next-token prediction on the validation split (up to `max_tokens`),
  scored by loss, top-1 accuracy and the calibration of its top-1 confidence; a
  temperature is fitted on one part of the tokens and judged on the other;
- answers (when a tokenizer and arithmetic problems are given): one greedy answer per
  question through the chat template, correct by the `arithmetic_exact` reward, with
  confidence = the model's probability of that whole response, i.e. the product of the
  token probabilities of every generated token up to and including `<|end|>`. The
  product (not the geometric mean) is a real probability of the output, so it can be
  calibrated against accuracy; the geometric mean is kept per answer for inspection.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from prefect import task
from pydantic import BaseModel, Field

from tasks.eval.config import EvalConfig
from models.calibration import (
    CalibrationReport,
    ReliabilityBins,
    calibration_report,
    ece,
    fit_temperature,
    reliability_bins,
    top1_from_logits,
)
from models.llama import Transformer
from infra.atomic import write_text_atomic

EVAL_FILE = "eval.json"
TOKEN_RELIABILITY_PNG = "reliability_tokens.png"
ANSWER_RELIABILITY_PNG = "reliability_answers.png"


class AnswerRecord(BaseModel):
    """One question, the model's greedy response and how it was scored."""

    question: str
    expected: int
    response: str
    correct: bool
    confidence: float  # product of the response's token probabilities
    mean_token_prob: float  # geometric mean of the same
    n_tokens: int
    finished: bool  # ended with <|end|> within max_answer_tokens


class EvalResult(BaseModel):
    """Every number of one model's evaluation; `metrics()` flattens it for MLflow."""

    n_tokens: int
    seq_len: int
    val_loss: float
    perplexity: float
    token_accuracy: float
    token_calibration: CalibrationReport
    token_bins: ReliabilityBins
    answer_calibration: CalibrationReport | None = None
    answer_bins: ReliabilityBins | None = None
    answers: list[AnswerRecord] = Field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics (e.g. `token.ece`, `answer.accuracy`), skipping ones not computed."""
        # `val_ppl` as the training runs name it; the accuracy comes as `token.accuracy` below.
        out = {
            "val_loss": self.val_loss,
            "val_ppl": self.perplexity,
            "n_tokens": float(self.n_tokens),
        }
        for prefix, report in (("token", self.token_calibration), ("answer", self.answer_calibration)):
            if report is None:
                continue
            for key, value in report.model_dump().items():
                if value is not None:
                    out[f"{prefix}.{key}"] = float(value)
        return out


# ----------------------------------------------------------------------------- token level


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
def _token_pass(model: Transformer, tokens: np.ndarray, n_pred: int, seq_len: int, cfg: EvalConfig, keep: np.ndarray):
    """One pass over the windows: loss sum, top-1 confidence/correctness, and logits of the `keep` predictions."""
    device = next(model.parameters()).device
    vocab = model.cfg.vocab_size
    conf = np.empty(n_pred, dtype=np.float64)
    correct = np.empty(n_pred, dtype=bool)
    kept_logits = torch.empty(len(keep), vocab, dtype=torch.float16)
    kept_labels = torch.empty(len(keep), dtype=torch.long)
    loss_sum = 0.0
    offset = 0
    for batch in _batches(_windows(n_pred, seq_len), cfg.batch_size):
        length = batch[0][1]
        rows = np.stack([np.asarray(tokens[s : s + length + 1], dtype=np.int64) for s, _ in batch])
        x = torch.from_numpy(rows[:, :-1]).to(device)
        y = torch.from_numpy(rows[:, 1:]).to(device)
        logits = model(x).float().flatten(0, 1)
        logp = torch.log_softmax(logits, dim=-1)
        y = y.flatten()
        loss_sum -= float(logp.gather(-1, y[:, None]).sum())
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
    return loss_sum, conf, correct, kept_logits, kept_labels


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


def token_metrics(model: Transformer, val_tokens: np.ndarray, cfg: EvalConfig) -> dict:
    """Loss, perplexity, accuracy and calibration of next-token predictions on `val_tokens`."""
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
        loss_sum, conf, correct, logits, labels = _token_pass(model, val_tokens, n_pred, seq_len, cfg, keep)
    finally:
        model.train(was_training)
    report = calibration_report(conf, correct, cfg.n_bins)
    t, before, after = _temperature_study(logits, labels, cfg, rng)
    report = report.model_copy(update={"temperature": t, "ece_heldout": before, "ece_after_temperature": after})
    loss = loss_sum / n_pred
    return {
        "n_tokens": n_pred,
        "seq_len": seq_len,
        "val_loss": loss,
        "perplexity": math.exp(loss),
        "token_accuracy": float(correct.mean()),
        "token_calibration": report,
        "token_bins": reliability_bins(conf, correct, cfg.n_bins),
    }


# ----------------------------------------------------------------------------- answer level


def answer_records(model: Transformer, tokenizer, problems: Sequence, cfg: EvalConfig) -> list[AnswerRecord]:
    """Greedy response to each problem via the chat template, scored by `cfg.reward`."""
    from tasks.eval.answers import greedy_answers
    from tasks.eval.rewards import get_reward

    reward = get_reward(cfg.reward)
    return [
        AnswerRecord(
            question=a.problem.question,
            expected=int(a.problem.answer),
            response=a.text,
            correct=reward(a.text, a.problem) >= 1.0,
            confidence=float(math.exp(a.logprob)),
            mean_token_prob=float(math.exp(a.logprob / max(a.n_tokens, 1))),
            n_tokens=a.n_tokens,
            finished=a.finished,
        )
        for a in greedy_answers(model, tokenizer, problems, cfg.max_answer_tokens, cfg.batch_size)
    ]


# ----------------------------------------------------------------------------- stage


def evaluate_model(
    model: Transformer,
    val_tokens: np.ndarray,
    tokenizer=None,
    problems: Sequence | None = None,
    cfg: EvalConfig | None = None,
) -> EvalResult:
    """Token-level metrics on `val_tokens`, plus answer-level calibration when tokenizer and problems are given."""
    cfg = cfg or EvalConfig()
    result = EvalResult(**token_metrics(model, val_tokens, cfg))
    if tokenizer is not None and problems:
        answers = answer_records(model, tokenizer, problems, cfg)
        conf = [a.confidence for a in answers]
        correct = [a.correct for a in answers]
        result.answers = answers
        result.answer_calibration = calibration_report(conf, correct, cfg.n_bins)
        result.answer_bins = reliability_bins(conf, correct, cfg.n_bins)
    return result


def _pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def evaluate_checkpoint(
    model_dir: Path,
    tokens_dir: Path,
    tokenizer_path: Path | None,
    cfg: EvalConfig,
    out_dir: Path,
    name: str | None = None,
) -> EvalResult:
    """Evaluate a saved model (safetensors + config.json) on the val split; write eval.json and reliability PNGs."""
    from models.export import load_model
    from tasks.eval.arithmetic import make_problems
    from tasks.reports.plots import reliability_diagram_png
    from tasks.tokenizer.tokenize_shards import load_token_split
    from tasks.tokenizer.train import load_tokenizer

    model = load_model(Path(model_dir), map_location=_pick_device(cfg.device))
    val = load_token_split(Path(tokens_dir), "val")
    tokenizer = load_tokenizer(Path(tokenizer_path)) if tokenizer_path is not None else None
    problems = None
    if tokenizer is not None and cfg.n_questions > 0:
        problems = make_problems(
            cfg.n_questions, cfg.seed, max_operand=cfg.arithmetic_max_operand, ops=cfg.arithmetic_ops, split="eval"
        )
    result = evaluate_model(model, val, tokenizer, problems, cfg)
    out_dir = Path(out_dir)
    label = name or Path(model_dir).name
    write_text_atomic(out_dir / EVAL_FILE, result.model_dump_json(indent=2))
    reliability_diagram_png(
        result.token_bins, out_dir / TOKEN_RELIABILITY_PNG, f"{label}: next-token", result.token_calibration.ece
    )
    if result.answer_bins is not None and result.answer_calibration is not None:
        reliability_diagram_png(
            result.answer_bins, out_dir / ANSWER_RELIABILITY_PNG, f"{label}: answers", result.answer_calibration.ece
        )
    return result


def load_eval_result(out_dir: Path) -> EvalResult:
    """Read the eval.json that evaluate_checkpoint wrote."""
    path = Path(out_dir) / EVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; run evaluate_checkpoint for this model first")
    return EvalResult.model_validate_json(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- comparison

_ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, metric key in EvalResult.metrics(), format)
    ("val loss", "val_loss", ".4f"),
    ("perplexity", "val_ppl", ".2f"),
    ("next-token accuracy", "token.accuracy", ".4f"),
    ("token ECE", "token.ece", ".4f"),
    ("token ECE (equal mass)", "token.ece_equal_mass", ".4f"),
    ("token MCE", "token.mce", ".4f"),
    ("token Brier", "token.brier", ".4f"),
    ("token NLL (top-1 conf.)", "token.nll", ".4f"),
    ("fitted temperature", "token.temperature", ".3f"),
    ("token ECE held-out, T=1", "token.ece_heldout", ".4f"),
    ("token ECE held-out, fitted T", "token.ece_after_temperature", ".4f"),
    ("answer accuracy", "answer.accuracy", ".3f"),
    ("answer ECE", "answer.ece", ".4f"),
    ("answer Brier", "answer.brier", ".4f"),
    ("answer NLL", "answer.nll", ".4f"),
    ("questions", "answer.n", ".0f"),
)


def comparison_table(results: Mapping[str, EvalResult]) -> str:
    """Markdown table: one row per metric, one column per model (e.g. base, sft, grpo); '-' where not measured."""
    names = list(results)
    metrics = {n: r.metrics() for n, r in results.items()}
    lines = ["| metric | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]
    for label, key, fmt in _ROWS:
        cells = [format(metrics[n][key], fmt) if key in metrics[n] else "-" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_comparison(results: Mapping[str, EvalResult], out_dir: Path) -> tuple[Path, Path]:
    """comparison.md and calibration_comparison.png (answer-level when every model has it, else token-level)."""
    from tasks.reports.plots import compare_models_png

    out_dir = Path(out_dir)
    md = write_text_atomic(out_dir / "comparison.md", comparison_table(results) + "\n")
    answers = all(r.answer_calibration is not None for r in results.values())
    reports = {
        n: (r.answer_calibration, r.answer_bins) if answers else (r.token_calibration, r.token_bins)
        for n, r in results.items()
    }
    level = "answers" if answers else "next-token predictions"
    png = compare_models_png(reports, out_dir / "calibration_comparison.png", f"Calibration of {level}")
    return md, png


evaluate_checkpoint_task = task(evaluate_checkpoint, name="evaluate")
