"""The pretraining flow: tokenizer → token shards → DeepSpeed pretraining, compared with the unigram baseline.

The pipeline calls the same three stages itself (flows/pipeline_flow.py); this flow runs them
alone on a data manifest, for a deployment or a rerun of pretraining only.
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from infra.workspace.paths import Workspace
from infra.lifecycle.signals import stop_on_cancel
from infra.stages import place, run
from infra.workspace.lock import workspace_lock
from tasks.tokenizer.tokenize_shards import TokenizeConfig, TokenizeShards
from tasks.tokenizer.train import TokenizerConfig, TrainTokenizer
from tasks.training.config import PretrainConfig
from tasks.reports.pretrain import pretrain_markdown
from tasks.training.pretrain.stage import Pretrain, PretrainResult


class TokenizedData(BaseModel):
    """The tokenizer and the token shards of a manifest."""

    tokenizer: Path
    tokens: Path


def tokenized(ws: Workspace, manifest: Path, tokenizer: TokenizerConfig, tokenize: TokenizeConfig) -> TokenizedData:
    """Train the tokenizer on the manifest's shards and tokenize them (both cached stages)."""
    tokenizer_path = run(TrainTokenizer(tokenizer), ws, manifest=Path(manifest))
    tokens = place(TokenizeShards(tokenize), ws, manifest=Path(manifest), tokenizer=tokenizer_path)
    tokens.run()
    return TokenizedData(tokenizer=tokenizer_path, tokens=tokens.out_dir)


@flow(name="pretrain", log_prints=True)
def pretrain_flow(config: PretrainConfig, manifest: str, workdir: str = "work", tokenizer: TokenizerConfig | None = None,
                  tokenize: TokenizeConfig | None = None) -> PretrainResult:
    """Tokenizer (`tokenizer`), token shards (`tokenize`) and pretraining (`config`) of the shards of `manifest`."""
    ws = Workspace.locate(workdir).ensure_writable()
    with stop_on_cancel(), workspace_lock(ws):
        data = tokenized(ws, Path(manifest), tokenizer or TokenizerConfig(), tokenize or TokenizeConfig())
        result = run(Pretrain(config), ws, tokens=data.tokens, tokenizer=data.tokenizer)
        print(pretrain_markdown(result, data.tokens))
        return result
