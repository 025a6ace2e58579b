"""Post-training flows: SFT then GRPO, each one MLflow run launched through DeepSpeed."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from infra.paths import Workspace
from infra.stage_cache import run_cached
from infra.tracking import stage_run
from tasks.training.grpo.stage import GrpoStageConfig, GrpoStageResult, grpo_task
from tasks.training.sft.stage import SftConfig, SftResult, sft_task


@flow(name="sft", log_prints=True)
def sft_flow(config: SftConfig, base_model: str, tokenizer: str, workdir: str = "work") -> SftResult:
    ws = Workspace.locate(workdir).ensure_writable()
    with stage_run(ws, "sft", config) as run:
        return run_cached(
            sft_task, ws, Path(base_model), Path(tokenizer), ws.checkpoints("sft"), config, str(ws.root),
            mlflow_run_id=run.info.run_id, outputs=lambda r: [r.model_dir],
        )


@flow(name="grpo", log_prints=True)
def grpo_flow(config: GrpoStageConfig, sft_model: str, tokenizer: str, workdir: str = "work") -> GrpoStageResult:
    ws = Workspace.locate(workdir).ensure_writable()
    with stage_run(ws, "grpo", config) as run:
        result = run_cached(
            grpo_task, ws, Path(sft_model), Path(tokenizer), ws.checkpoints("grpo"), config, str(ws.root),
            mlflow_run_id=run.info.run_id, outputs=lambda r: [r.model_dir],
        )
        print(
            f"held-out arithmetic: SFT {result.before.n_correct}/{result.before.n} "
            f"(reward {result.before.mean_reward:.3f}) -> GRPO {result.after.n_correct}/{result.after.n} "
            f"(reward {result.after.mean_reward:.3f})"
        )
        return result
