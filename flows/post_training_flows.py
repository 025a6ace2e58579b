"""Post-training flows: SFT then GRPO, each one MLflow run launched through DeepSpeed."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from infra.paths import Workspace
from infra.stage_cache import flow_key, OUT, run_cached
from infra.tracking import stage_run
from infra.run_signals import stop_on_cancel
from infra.workspace_lock import workspace_lock
from tasks.training.config import GrpoConfig, SftConfig
from tasks.training.grpo.stage import GrpoStageResult, grpo_task
from tasks.training.sft.stage import SftResult, sft_task


@flow(name="sft", log_prints=True)
def sft_flow(config: SftConfig, base_model: str, tokenizer: str, workdir: str = "work",
             tokens: str | None = None) -> SftResult:
    """SFT of `base_model`; `tokens` (the pretraining token shards) feeds config.replay_fraction."""
    ws = Workspace.locate(workdir).ensure_writable()
    replay = Path(tokens) if tokens else None
    inputs = {"base": Path(base_model), "tokens": replay}
    with stop_on_cancel(), workspace_lock(ws), stage_run(ws, "sft", config, run_key=flow_key("sft", __name__, config, inputs)) as run:
        return run_cached(
            sft_task, ws, "checkpoints/sft", Path(base_model), Path(tokenizer), OUT, config, str(ws.root),
            mlflow_run_id=run.info.run_id, replay_tokens=replay,
        )


@flow(name="grpo", log_prints=True)
def grpo_flow(config: GrpoConfig, sft_model: str, tokenizer: str, workdir: str = "work") -> GrpoStageResult:
    ws = Workspace.locate(workdir).ensure_writable()
    with stop_on_cancel(), workspace_lock(ws), stage_run(ws, "grpo", config, run_key=flow_key("grpo", __name__, config, {"sft": Path(sft_model)})) as run:
        result = run_cached(
            grpo_task, ws, "checkpoints/grpo", Path(sft_model), Path(tokenizer), OUT, config, str(ws.root),
            mlflow_run_id=run.info.run_id,
        )
        print(
            f"held-out arithmetic: SFT {result.before.n_correct}/{result.before.n} "
            f"(reward {result.before.mean_reward:.3f}) -> GRPO {result.after.n_correct}/{result.after.n} "
            f"(reward {result.after.mean_reward:.3f})"
        )
        return result
