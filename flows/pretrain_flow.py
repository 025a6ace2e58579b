"""The pretraining flow: tokenizer → token shards → DeepSpeed training → evaluation against
the unigram baseline. One MLflow run, nested under the pipeline's run when there is one."""
from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from infra.paths import Workspace
from flows.config import PretrainStageConfig
from infra.stage_cache import flow_key, OUT, run_cached, run_into
from infra.tracking import stage_run
from infra.run_signals import stop_on_cancel
from infra.workspace_lock import workspace_lock
from tasks.training.pretrain.stage import pretrain_task
from tasks.reports.pretrain import log_pretrain_report
from tasks.tokenizer.tokenize_shards import tokenize_shards_task
from tasks.tokenizer.train import train_tokenizer_task


class PretrainFlowOutput(BaseModel):
    """What the pretraining flow hands on: tokenizer, token shards, the trained model and its perplexities."""

    tokenizer: Path
    tokens: Path
    model_dir: Path
    loss_curve: Path | None
    val_ppl: float | None
    unigram_ppl: float
    mlflow_run_id: str


@flow(name="pretrain", log_prints=True)
def pretrain_flow(config: PretrainStageConfig, manifest: str, workdir: str = "work") -> PretrainFlowOutput:
    ws = Workspace.locate(workdir).ensure_writable()
    with stop_on_cancel(), workspace_lock(ws), stage_run(ws, "pretrain", config, run_key=flow_key("pretrain", __name__, config, {"manifest": Path(manifest)})) as run:
        tokenizer = run_cached(train_tokenizer_task, ws, "tokenizer", Path(manifest), OUT, config.tokenizer)
        _, tokens = run_into(tokenize_shards_task, ws, "tokens", Path(manifest), tokenizer, OUT, config.tokenize)
        result = run_cached(
            pretrain_task, ws, "checkpoints/pretrain", tokens, tokenizer, OUT, config.train, str(ws.root),
            mlflow_run_id=run.info.run_id,
        )
        report = log_pretrain_report(tokenizer, tokens, result, ws.run_reports(run.info.run_id))
        print(report.markdown)
        return PretrainFlowOutput(
            tokenizer=tokenizer, tokens=tokens, model_dir=result.model_dir, loss_curve=result.loss_curve, val_ppl=result.val_ppl,
            unigram_ppl=report.unigram_ppl, mlflow_run_id=run.info.run_id,
        )
