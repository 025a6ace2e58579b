"""Log the calibration comparison (table, figure, per-model metrics) to the active MLflow run."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tasks.eval.evaluate import EVAL_FILE, EvalResult, comparison_table, write_comparison


def log_comparison(results: Mapping[str, EvalResult], out_dir: Path) -> str:
    import mlflow

    table_path, figure_path = write_comparison(results, out_dir)
    for name, result in results.items():
        mlflow.log_metrics({f"{name}.{k}": v for k, v in result.metrics().items()})
        for png in sorted((out_dir / name).glob("*.png")):
            mlflow.log_artifact(str(png), artifact_path=f"eval/{name}")
        mlflow.log_artifact(str(out_dir / name / EVAL_FILE), artifact_path=f"eval/{name}")
    mlflow.log_artifact(str(table_path), artifact_path="eval")
    mlflow.log_artifact(str(figure_path), artifact_path="eval")
    return comparison_table(results)
