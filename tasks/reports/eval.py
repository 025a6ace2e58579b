"""Log the calibration comparison (table, figure, per-model metrics) to the active MLflow run."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from infra.tracking import active_run, log_artifact, log_metrics
from tasks.eval.evaluate import EVAL_FILE, EvalResult, comparison_table, write_comparison


def log_comparison(results: Mapping[str, EvalResult], out_dir: Path) -> str:
    """Write and log the comparison of `results`, each model's metrics and figures; returns the Markdown table."""
    active_run()
    table_path, figure_path = write_comparison(results, out_dir)
    for name, result in results.items():
        log_metrics({f"{name}.{k}": v for k, v in result.metrics().items()})
        for png in sorted((out_dir / name).glob("*.png")):
            log_artifact(png, artifact_path=f"eval/{name}")
        log_artifact(out_dir / name / EVAL_FILE, artifact_path=f"eval/{name}")
    log_artifact(table_path, artifact_path="eval")
    log_artifact(figure_path, artifact_path="eval")
    return comparison_table(results)
