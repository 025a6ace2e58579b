"""The evaluation's report: diagrams, comparison tables and figures, logged to the active MLflow run.

Each model's reliability diagrams, and the comparison tables (metrics, paired differences, selective
prediction) and figures.

The numbers come from tasks/eval (evaluate: one model's EvalResult; differences: consecutive
models compared); this module only renders them.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from infra.tracking.runs import active_run, log_artifact, log_metrics
from infra.workspace.atomic import write_text_atomic
from models.calibration import CalibrationReport, ReliabilityBins
from tasks.eval.differences import PAIRED_LEVELS, difference_metrics, stage_differences
from tasks.eval.evaluate import EVAL_FILE, EvalResult
from tasks.reports.plots import accuracy_coverage_png, compare_models_png, reliability_diagram_png

TOKEN_RELIABILITY_PNG = "reliability_tokens.png"
ANSWER_RELIABILITY_PNG = "reliability_answers.png"
CHOICE_RELIABILITY_PNG = "reliability_choices.png"


# ----------------------------------------------------------------------------- one model's figures


def bins_ece(report: CalibrationReport, bins: ReliabilityBins) -> tuple[float, float | None, float | None]:
    """The ECE of `report` binned as `bins` are (equal width or equal mass), with its interval."""
    if bins.strategy == "quantile":
        return report.ece_equal_mass, report.ece_equal_mass_lo, report.ece_equal_mass_hi
    return report.ece, report.ece_lo, report.ece_hi


def write_reliability_diagrams(result: EvalResult, label: str, out_dir: Path) -> list[Path]:
    """`label`'s reliability diagrams in `out_dir`: next-token, and answers and multiple choice where measured."""
    out_dir = Path(out_dir)
    pngs = [reliability_diagram_png(result.token_bins, out_dir / TOKEN_RELIABILITY_PNG, f"{label}: next-token",
                                    result.token_calibration.ece)]
    prompt = "few-shot prompt" if result.answer_format == "few_shot" else "chat"
    for report, bins, png, what in ((result.answer_calibration, result.answer_bins, ANSWER_RELIABILITY_PNG, "answers"),
                                    (result.choice_calibration, result.choice_bins, CHOICE_RELIABILITY_PNG, "multiple choice")):
        if report is not None and bins is not None:
            value, lo, hi = bins_ece(report, bins)
            pngs.append(reliability_diagram_png(bins, out_dir / png, f"{label}: {what} ({prompt})", value, (lo, hi)))
    return pngs


# ----------------------------------------------------------------------------- comparison tables

_ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, metric key in EvalResult.metrics(), format); `<key>_lo`/`_hi`, where logged, print as [lo, hi]
    ("validation tokens scored (from the start of the val split)", "n_tokens", ".0f"),
    ("their text, UTF-8 bytes (special tokens excluded)", "n_bytes", ".0f"),
    ("next-token loss, nats per token (the evaluation's validation windows)", "val_loss", ".4f"),
    ("perplexity", "val_ppl", ".2f"),
    ("bits per byte (comparable across tokenizers)", "bpb", ".4f"),
    ("next-token accuracy", "token.accuracy", ".4f"),
    ("token ECE", "token.ece", ".4f"),
    ("token ECE (equal mass)", "token.ece_equal_mass", ".4f"),
    ("token MCE", "token.mce", ".4f"),
    ("token Brier", "token.brier", ".4f"),
    ("token NLL (top-1 conf.)", "token.nll", ".4f"),
    ("fitted temperature", "token.temperature", ".3f"),
    ("token ECE held-out, T=1", "token.ece_heldout", ".4f"),
    ("token ECE held-out, fitted T", "token.ece_after_temperature", ".4f"),
    ("answer accuracy [95% CI]", "answer.accuracy", ".3f"),
    ("answer accuracy, operands in the training range", "answer_in_range.accuracy", ".3f"),
    ("abstention rate (answered \"I don't know\")", "answer.abstention_rate", ".3f"),
    ("hallucination rate (wrong and not abstained, of all questions)", "answer.hallucination_rate", ".3f"),
    ("accuracy on the questions not abstained on", "answer.answered_accuracy", ".3f"),
    ("answer ECE", "answer.ece", ".4f"),
    ("answer ECE (equal mass)", "answer.ece_equal_mass", ".4f"),
    ("answer Brier", "answer.brier", ".4f"),
    ("answer NLL", "answer.nll", ".4f"),
    ("answer AURC", "answer.aurc", ".4f"),
    ("multiple-choice accuracy", "choice.accuracy", ".3f"),
    ("multiple-choice ECE (equal mass)", "choice.ece_equal_mass", ".4f"),
    ("multiple-choice Brier", "choice.brier", ".4f"),
    ("multiple-choice AURC", "choice.aurc", ".4f"),
)
_NOT_ANSWERED = "n/a (no answer)"


def _cell(metrics: Mapping[str, float], key: str, fmt: str) -> str:
    if key.startswith("answer") and metrics.get("answer.n_stated") == 0 and "answer.abstention_rate" not in metrics:
        return _NOT_ANSWERED
    if key not in metrics:
        return "-"
    text = format(metrics[key], fmt)
    if f"{key}_lo" in metrics and f"{key}_hi" in metrics:
        text += f" [{metrics[f'{key}_lo']:{fmt}}, {metrics[f'{key}_hi']:{fmt}}]"
    return text


def _questions(r: EvalResult) -> str:
    if not r.answers:
        return "-"
    prompt = "few-shot" if r.answer_format == "few_shot" else "chat"
    return f"{len(r.answers)} ({r.n_stated} stated a number, {r.n_abstained} abstained, {prompt})"


def comparison_table(results: Mapping[str, EvalResult]) -> str:
    """Markdown table: one row per metric, one column per model (e.g. base, sft, grpo); '-' where not measured,
    n/a where a model stated no answer."""
    names = list(results)
    metrics = {n: r.metrics() for n, r in results.items()}
    lines = ["| metric | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]
    for label, key, fmt in _ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(metrics[n], key, fmt) for n in names) + " |")
    lines.append("| questions (stated a number, abstained, prompt) | " + " | ".join(_questions(results[n]) for n in names) + " |")
    return "\n".join(lines)


def differences_table(results: Mapping[str, EvalResult]) -> str:
    """Markdown: each model's accuracy minus the previous one's, paired 95% interval, and whether it is significant."""
    diffs = stage_differences(results)
    names = list(results)
    lines = ["| accuracy difference (paired, 95% CI) | answers | answers, operands in the training range "
             "| multiple choice |", "|---|---|---|---|"]
    for a, b in zip(names, names[1:]):
        cells = [diffs[f"{b}_vs_{a}.{level}"].describe(a, b) if f"{b}_vs_{a}.{level}" in diffs else "n/a"
                 for level in PAIRED_LEVELS]
        lines.append(f"| {b} − {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def selective_table(results: Mapping[str, EvalResult]) -> str:
    """Markdown: AURC and the confidence threshold that reaches the target accuracy, per model and task."""
    target = next((s.target_accuracy for r in results.values() for s in (r.answer_selective, r.choice_selective)
                   if s is not None), None)
    head = f"threshold for accuracy ≥ {target:.2f}" if target is not None else "threshold"
    lines = [f"| model, task | AURC [95% CI] (E-AURC) | {head} | coverage | accuracy there [95% CI] |",
             "|---|---:|---:|---:|---|"]
    for name, r in results.items():
        for what, sel in (("answers", r.answer_selective), ("multiple choice", r.choice_selective)):
            if sel is None:
                if what == "answers" and r.answers:
                    lines.append(f"| {name}, {what} | {_NOT_ANSWERED} | | | |")
                continue
            if sel.threshold_at_target is None:
                reach = "not reached | 0 | -"
            else:
                reach = (f"{sel.threshold_at_target:.3g} | {sel.coverage_at_target:.1%} ({sel.answered_at_target}) | "
                         f"{sel.accuracy_at_target:.3f} [{sel.accuracy_at_target_lo:.3f}, {sel.accuracy_at_target_hi:.3f}]")
            band = f" [{sel.aurc_lo:.4f}, {sel.aurc_hi:.4f}]" if sel.aurc_lo is not None and sel.aurc_hi is not None else ""
            lines.append(f"| {name}, {what} | {sel.aurc:.4f}{band} ({sel.e_aurc:.4f}) | {reach} |")
    return "\n".join(lines)


def tasks_table(results: Mapping[str, EvalResult]) -> str | None:
    """Markdown: every eval.tasks task on every model, lm-eval's metrics ± its standard error, and the calibration of
    the items (equal-mass ECE, Brier, AURC with 95% intervals); None when no model ran a task."""
    rows = [(task, name, scores) for name, r in results.items() for task, scores in r.tasks.items()]
    if not rows:
        return None
    lines = ["| task | model | n | lm-eval metrics (± standard error) | ECE, equal mass [95% CI] | Brier [95% CI] | "
             "AURC [95% CI] |", "|---|---|---:|---|---:|---:|---:|"]
    for task, name, s in sorted(rows, key=lambda row: row[0]):
        shown = ", ".join(f"{k} {v:.4f}" + (f" ± {s.stderr[k]:.4f}" if k in s.stderr else "") for k, v in s.metrics.items())
        if s.contaminated is not None:  # the items the decontamination found, apart
            shown += f"; right on clean items {s.clean.describe() if s.clean else 'n/a'}, on contaminated {s.contaminated.describe()}"
        c, sel = s.calibration, s.selective
        ece = _with_band(c.ece_equal_mass, c.ece_equal_mass_lo, c.ece_equal_mass_hi) if c else "n/a"
        brier = _with_band(c.brier, c.brier_lo, c.brier_hi) if c else "n/a"
        aurc_ = _with_band(sel.aurc, sel.aurc_lo, sel.aurc_hi) if sel else "n/a"
        lines.append(f"| {task} ({s.lm_eval_task}) | {name} | {s.n} | {shown} | {ece} | {brier} | {aurc_} |")
    return "\n".join(lines)


def _with_band(value: float, lo: float | None, hi: float | None) -> str:
    return f"{value:.4f}" + (f" [{lo:.4f}, {hi:.4f}]" if lo is not None and hi is not None else "")


def comparison_markdown(results: Mapping[str, EvalResult]) -> str:
    """The comparison tables: metrics, paired differences, selective prediction, the eval.tasks."""
    tables = [comparison_table(results), differences_table(results), selective_table(results), tasks_table(results)]
    return "\n\n".join(t for t in tables if t)


# ----------------------------------------------------------------------------- files and MLflow


def write_comparison(results: Mapping[str, EvalResult], out_dir: Path) -> tuple[Path, Path]:
    """comparison.md and calibration_comparison.png (answer-level for the models that answered, else token-level)."""
    out_dir = Path(out_dir)
    md = write_text_atomic(out_dir / "comparison.md", comparison_markdown(results) + "\n")
    answered = {n: r for n, r in results.items() if r.answer_calibration is not None}
    if answered:
        reports = {n: (r.answer_calibration, r.answer_bins) for n, r in answered.items()}
        missing = [n for n in results if n not in answered]
        title = "Calibration of answers" + (f" (n/a, no answers: {', '.join(missing)})" if missing else "")
    else:
        reports = {n: (r.token_calibration, r.token_bins) for n, r in results.items()}
        title = "Calibration of next-token predictions"
    png = compare_models_png(reports, out_dir / "calibration_comparison.png", title)
    return md, png


def write_accuracy_coverage(results: Mapping[str, EvalResult], out_dir: Path) -> Path | None:
    """accuracy_coverage.png: each model's accuracy-coverage curves (answers, multiple choice); None without any."""
    curves = {f"{n}, {what}": sel for n, r in results.items()
              for what, sel in (("answers", r.answer_selective), ("multiple choice", r.choice_selective)) if sel is not None}
    if not curves:
        return None
    return accuracy_coverage_png(curves, Path(out_dir) / "accuracy_coverage.png")


def log_comparison(results: Mapping[str, EvalResult], eval_dirs: Mapping[str, Path], out_dir: Path) -> str:
    """Write the comparison of `results` into out_dir and log it with each model's metrics, its reliability
    diagrams (drawn into out_dir/<name>) and eval.json (in `eval_dirs[name]`), and the paired differences
    between consecutive models; returns the Markdown tables."""
    active_run()
    out_dir = Path(out_dir)
    table_path, figure_path = write_comparison(results, out_dir)
    coverage_path = write_accuracy_coverage(results, out_dir)
    for name, result in results.items():
        log_metrics({f"{name}.{k}": v for k, v in result.metrics().items()})
        for png in write_reliability_diagrams(result, name, out_dir / name):
            log_artifact(png, artifact_path=f"eval/{name}")
        log_artifact(eval_dirs[name] / EVAL_FILE, artifact_path=f"eval/{name}")
    log_metrics(difference_metrics(results))
    for path in (table_path, figure_path, coverage_path):
        if path is not None:
            log_artifact(path, artifact_path="eval")
    return comparison_markdown(results)
