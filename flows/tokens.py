"""The tokenizer and the token shards of a data manifest: two cached stages that the pipeline and the sweep share."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from infra.stages import place, run
from infra.workspace.paths import Workspace
from tasks.tokenizer.tokenize_shards import TokenizeConfig, TokenizeShards
from tasks.tokenizer.train import TokenizerConfig, TrainTokenizer


class TokenizedData(BaseModel):
    """The tokenizer and the token shards of a manifest."""

    tokenizer: Path
    tokens: Path


def tokenized(ws: Workspace, manifest: Path, tokenizer: TokenizerConfig, tokenize: TokenizeConfig) -> TokenizedData:
    """Train the tokenizer on the manifest's shards and tokenize them (both cached stages)."""
    tokenizer_path = run(TrainTokenizer(tokenizer), ws, manifest=Path(manifest))
    return TokenizedData(tokenizer=tokenizer_path, tokens=tokens_of(ws, manifest, tokenizer_path, tokenize))


def tokens_of(ws: Workspace, manifest: Path, tokenizer_path: Path, tokenize: TokenizeConfig) -> Path:
    """The manifest's shards tokenized with a given tokenizer (a cached stage): its token folder."""
    tokens = place(TokenizeShards(tokenize), ws, manifest=Path(manifest), tokenizer=tokenizer_path)
    tokens.run()
    return tokens.out_dir
