"""The pretraining flow: tokenizer → token shards → DeepSpeed training → evaluation against
the unigram baseline. One MLflow run, nested under the pipeline's run when there is one."""
from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from infra.paths import Workspace
from flows.config import PretrainStageConfig
from infra.stage_cache import run_cached
from infra.tracking import stage_run
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
    with stage_run(ws, "pretrain", config) as run:
        tokenizer = run_cached(train_tokenizer_task, ws, Path(manifest), ws.tokenizer_dir, config.tokenizer, outputs=lambda p: [p])
        run_cached(  # writes ws.tokens, which pretraining reads
            tokenize_shards_task, ws, Path(manifest), tokenizer, ws.tokens, config.tokenize,
            outputs=lambda _: [ws.tokens / "index.json"],
        )
        result = run_cached(
            pretrain_task, ws, ws.tokens, tokenizer, ws.checkpoints("pretrain"), config.train, str(ws.root),
            mlflow_run_id=run.info.run_id, outputs=lambda r: [r.model_dir],
        )
        report = log_pretrain_report(tokenizer, ws.tokens, result, ws.reports)
        print(report.markdown)
        return PretrainFlowOutput(
            tokenizer=tokenizer, tokens=ws.tokens, model_dir=result.model_dir, loss_curve=result.loss_curve, val_ppl=result.val_ppl,
            unigram_ppl=report.unigram_ppl, mlflow_run_id=run.info.run_id,
        )
