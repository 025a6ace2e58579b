"""The pretraining flow: tokenizer → token shards → DeepSpeed training → evaluation against
the unigram baseline. One MLflow run, nested under the pipeline's run when there is one."""
from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from infra.paths import Workspace
from tasks.training.config import PretrainConfig
from infra.stage_cache import flow_key, OUT, run_cached, run_into
from infra.tracking import stage_run
from infra.run_signals import stop_on_cancel
from infra.workspace_lock import workspace_lock
from tasks.training.pretrain.stage import pretrain_task
from tasks.reports.pretrain import log_pretrain_report
from tasks.tokenizer.tokenize_shards import TokenizeConfig, tokenize_shards_task
from tasks.tokenizer.train import TokenizerConfig, train_tokenizer_task


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
def pretrain_flow(config: PretrainConfig, manifest: str, workdir: str = "work", tokenizer: TokenizerConfig | None = None,
                  tokenize: TokenizeConfig | None = None) -> PretrainFlowOutput:
    """Tokenizer (`tokenizer`), token shards (`tokenize`) and pretraining (`config`) of the shards of `manifest`."""
    ws = Workspace.locate(workdir).ensure_writable()
    tokenizer, tokenize = tokenizer or TokenizerConfig(), tokenize or TokenizeConfig()
    logged = {"tokenizer": tokenizer, "tokenize": tokenize, "pretrain": config}
    with stop_on_cancel(), workspace_lock(ws), stage_run(ws, "pretrain", logged, run_key=flow_key("pretrain", __name__, logged, {"manifest": Path(manifest)})) as run:
        tokenizer_path = run_cached(train_tokenizer_task, ws, "tokenizer", Path(manifest), OUT, tokenizer)
        _, tokens = run_into(tokenize_shards_task, ws, "tokens", Path(manifest), tokenizer_path, OUT, tokenize)
        result = run_cached(
            pretrain_task, ws, "checkpoints/pretrain", tokens, tokenizer_path, OUT, config, str(ws.root),
            mlflow_run_id=run.info.run_id,
        )
        report = log_pretrain_report(tokenizer_path, tokens, result, ws.run_reports(run.info.run_id))
        print(report.markdown)
        return PretrainFlowOutput(
            tokenizer=tokenizer_path, tokens=tokens, model_dir=result.model_dir, loss_curve=result.loss_curve, val_ppl=result.val_ppl,
            unigram_ppl=report.unigram_ppl, mlflow_run_id=run.info.run_id,
        )
