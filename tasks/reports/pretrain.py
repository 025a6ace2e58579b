"""Pretraining's evaluation step: validation perplexity against the unigram baseline of the
same tokenizer on the same validation tokens, plus the Chinchilla view of the run: its tokens per
parameter (all parameters, as Chinchilla counts them) against the compute-optimal ratio, which is
the one a scaling sweep fitted on the same data and tokenizer where there is one (`llmforge scale`),
else Chinchilla's 20."""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from infra.workspace.atomic import write_text_atomic
from infra.tracking.runs import log_artifact, log_artifacts, log_metrics, log_text, set_tag
from infra.stages import DS_CONFIG_FILE
from tasks.training.pretrain.stage import Pretrain, PretrainResult
from tasks.tokenizer.tokenize_shards import load_token_index, unigram_perplexity


class PretrainReport(BaseModel):
    """Pretraining's evaluation: validation perplexity beside the unigram baseline, the Chinchilla view, markdown."""

    unigram_ppl: float
    val_ppl: float | None
    chinchilla: str
    markdown: str


def log_pretrain_report(tokenizer: Path, tokens_dir: Path, result: PretrainResult, out_dir: Path) -> PretrainReport:
    """Compute the baseline, log the comparison and artifacts to the active MLflow run."""
    from models.export import load_config
    from models.flops import chinchilla, num_params
    from tasks.training.scaling.fit_record import find_fit

    unigram = unigram_perplexity(tokens_dir)
    index = load_token_index(tokens_dir)
    cfg = load_config(result.model_dir)
    n_params = num_params(cfg)
    fit = find_fit(tokens_dir) if result.tokens_seen else None
    if fit is not None:
        ratio = fit.optimal_ratio(6.0 * n_params * result.tokens_seen)
        report = chinchilla(n_params=n_params, tokens=result.tokens_seen, optimal_ratio=ratio.estimate,
                            ratio_source=fit.source(ratio))
    else:
        report = chinchilla(n_params=n_params, tokens=result.tokens_seen)
    lines = [
        "# Pretraining",
        "",
        "| metric | value |",
        "|---|---|",
        f"| parameters | {n_params:,} ({num_params(cfg, include_embeddings=False):,} non-embedding) |",
        f"| steps | {result.steps} |",
        f"| tokens seen | {result.tokens_seen:,} |",
        f"| train tokens available | {index.tokens('train'):,} |",
        f"| final train loss | {result.final_train_loss:.4f} |" if result.final_train_loss is not None else "| final train loss | - |",
        f"| validation perplexity | {result.val_ppl:.2f} |" if result.val_ppl is not None else "| validation perplexity | - |",
        f"| unigram baseline perplexity | {unigram:.2f} |",
        f"| tokens/s | {result.tokens_per_s:.0f} |" if result.tokens_per_s else "| tokens/s | - |",
        "",
        f"Chinchilla: {report.summary()}",
    ]
    markdown = "\n".join(lines)
    md = write_text_atomic(out_dir / "pretrain_report.md", markdown)
    metrics = {"unigram_ppl": unigram, "tokens_per_param": report.tokens_per_param,
               "optimal_tokens_per_param": report.optimal_ratio}
    if result.val_ppl is not None:
        metrics["final_val_ppl"] = result.val_ppl  # the worker's name, so a cached stage logs the same key
        metrics["val_ppl_over_unigram"] = result.val_ppl / unigram
    log_metrics(metrics)
    log_artifact(md, artifact_path="pretrain")
    log_artifact(tokenizer, artifact_path="tokenizer")
    log_text(json.dumps(index.model_dump(mode="json"), indent=2), "pretrain/token_index.json")
    for name in (Pretrain.config_file, DS_CONFIG_FILE):
        p = result.out_dir / name
        if p.is_file():
            log_artifact(p, artifact_path="pretrain")
    log_artifacts(result.model_dir, artifact_path="model")  # safetensors + config.json
    if report.warning:
        set_tag("chinchilla.warning", report.warning)
    return PretrainReport(unigram_ppl=unigram, val_ppl=result.val_ppl, chinchilla=report.summary(), markdown=markdown)
