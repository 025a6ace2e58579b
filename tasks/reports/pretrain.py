"""Pretraining's report, as Markdown: the run, its perplexity against a baseline, its tokens per parameter.

What the run trained, its validation perplexity beside the unigram baseline of the same tokenizer on the
same tokens, and the Chinchilla view of its tokens per parameter.

The numbers are the stage's (tasks/training/pretrain/stage.py measures the baseline and the Chinchilla view
after the run); this only renders them, and logs the page into the active MLflow run.
"""
from __future__ import annotations

from pathlib import Path

from infra.tracking.runs import log_artifact
from infra.workspace.atomic import write_text_atomic
from models.export import load_config
from models.flops import num_params
from tasks.tokenizer.tokenize_shards import load_token_index
from tasks.training.pretrain.stage import PretrainResult

REPORT_FILE = "pretrain_report.md"


def _value(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def pretrain_markdown(result: PretrainResult, tokens_dir: Path) -> str:
    """The pretraining run as a Markdown table, with its Chinchilla line."""
    cfg, base = load_config(result.model_dir), result.baselines
    lines = [
        "# Pretraining",
        "",
        "| metric | value |",
        "|---|---|",
        f"| parameters | {num_params(cfg):,} ({num_params(cfg, include_embeddings=False):,} non-embedding) |",
        f"| steps | {result.steps} |",
        f"| tokens seen | {result.tokens_seen:,} |",
        f"| train tokens available | {load_token_index(tokens_dir).tokens('train'):,} |",
        f"| final train loss | {_value(result.final_train_loss, '.4f')} |",
        f"| validation perplexity | {_value(result.final_val_ppl, '.2f')} |",
        f"| unigram baseline perplexity | {_value(base.unigram_ppl if base else None, '.2f')} |",
        f"| tokens/s | {_value(result.train_tokens_per_s or None, '.0f')} |",
    ]
    if base:
        lines += ["", f"Chinchilla: {base.chinchilla}"]
    return "\n".join(lines)


def log_pretrain_report(result: PretrainResult, tokens_dir: Path, reports: Path) -> str:
    """Write the report into `reports` and log it into the active MLflow run (under pretrain/); its Markdown."""
    markdown = pretrain_markdown(result, tokens_dir)
    log_artifact(write_text_atomic(Path(reports) / REPORT_FILE, markdown), artifact_path="pretrain")
    return markdown
