"""The pipeline's last step: report card, MLflow artifacts and headline metrics, registered model."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from infra.config import config_hash
from infra.paths import Workspace
from tasks.reports.card import reward_curve, write_final_report
from tasks.data.manifest import sha256_file
from tasks.reports.register import register_final_model
from tasks.reports.data import publish_prefect_artifact


class PipelineReport(BaseModel):
    path: Path
    markdown: str
    model_version: str


def publish_pipeline_report(ws: Workspace, config, data, base, sft, grpo, evals, wall_seconds: float) -> PipelineReport:
    import mlflow

    out = ws.reports
    images = {
        "pretraining loss": _copy(base.loss_curve, out / "pretrain_loss.png"),
        "SFT loss": _copy(sft.loss_curve, out / "sft_loss.png"),
        "GRPO reward": reward_curve(grpo.mlflow_run_id, out / "grpo_reward.png") if grpo.mlflow_run_id else None,
        "calibration": _copy(ws.eval_dir / "calibration_comparison.png", out / "calibration_comparison.png"),
    }
    path = write_final_report(
        Path(data.manifest), (base.val_ppl, base.unigram_ppl), sft, grpo, evals, images, wall_seconds, out / "report.md"
    )
    markdown = path.read_text()
    publish_prefect_artifact(markdown, key="pipeline-report")
    mlflow.log_artifact(str(path), artifact_path="report")
    for img in images.values():
        if img is not None:
            mlflow.log_artifact(str(img), artifact_path="report")
    mlflow.log_metrics(
        {
            "wall_minutes": wall_seconds / 60,
            "base.val_ppl": base.val_ppl or float("nan"),
            "base.unigram_ppl": base.unigram_ppl,
            "sft.heldout_accuracy": grpo.before.accuracy,
            "grpo.heldout_accuracy": grpo.after.accuracy,
            "sft.heldout_reward": grpo.before.mean_reward,
            "grpo.heldout_reward": grpo.after.mean_reward,
        }
    )
    lineage = {
        "manifest_sha256": sha256_file(Path(data.manifest)),
        "tokenizer_sha256": sha256_file(Path(base.tokenizer)),
        "config_hash": config_hash(config),
        "pipeline_run_id": mlflow.active_run().info.run_id,
        "data_run_id": data.mlflow_run_id,
        "pretrain_run_id": base.mlflow_run_id,
        "sft_run_id": sft.mlflow_run_id or "",
        "grpo_run_id": grpo.mlflow_run_id or "",
    }
    version = register_final_model(Path(grpo.model_dir), config.registered_model, lineage)
    return PipelineReport(path=path, markdown=markdown, model_version=version)


def _copy(src: Path | None, dst: Path) -> Path | None:
    """Put a figure beside the report so its relative links resolve."""
    import shutil

    if src is None or not Path(src).is_file():
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst
