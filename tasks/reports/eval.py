"""Log the calibration comparison (tables, figures, per-model metrics, paired differences) to the active MLflow run."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from infra.tracking import active_run, log_artifact, log_metrics
from tasks.eval.evaluate import (
    EVAL_FILE,
    EvalResult,
    comparison_markdown,
    difference_metrics,
    write_accuracy_coverage,
    write_comparison,
)


def log_comparison(results: Mapping[str, EvalResult], eval_dirs: Mapping[str, Path], out_dir: Path) -> str:
    """Write the comparison of `results` into out_dir and log it with each model's metrics, the paired
    differences between consecutive models and the figures in each eval folder (`eval_dirs[name]`);
    returns the Markdown tables."""
    active_run()
    table_path, figure_path = write_comparison(results, out_dir)
    coverage_path = write_accuracy_coverage(results, out_dir)
    for name, result in results.items():
        log_metrics({f"{name}.{k}": v for k, v in result.metrics().items()})
        for png in sorted(eval_dirs[name].glob("*.png")):
            log_artifact(png, artifact_path=f"eval/{name}")
        log_artifact(eval_dirs[name] / EVAL_FILE, artifact_path=f"eval/{name}")
    log_metrics(difference_metrics(results))
    for path in (table_path, figure_path, coverage_path):
        if path is not None:
            log_artifact(path, artifact_path="eval")
    return comparison_markdown(results)
