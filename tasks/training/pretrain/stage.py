"""Pretraining: next-token cross-entropy over windows of the token shards, on DeepSpeed ranks.

    base = run(Pretrain(config.pretrain), ws, tokens=tokens_dir, tokenizer=tokenizer_json)
      out_dir/pretrain_config.json   resolved config (model architecture included)
      out_dir/ds_config.json         the DeepSpeed config the ranks train with
      out_dir/checkpoints/           DeepSpeed checkpoints; a rerun into the same out_dir resumes
      out_dir/model/                 final weights (models.export.save_model), out_dir/hf/ for transformers
      out_dir/loss_curve.png, out_dir/result.json

Stage side (`prepare`): the tokenizer covers the shards' vocabulary and the architecture fits
the windows. Rank side: every rank builds the same model (same seed), memory-maps the token
files, and the one loop (tasks/training/loop.py) trains it with `LossSteps` of `lm_loss`;
rank 0 exports the model, the loss curve and result.json. After the run the stage side compares
validation perplexity with the tokenizer's unigram baseline on the same tokens, and the run's tokens
per parameter with the compute-optimal ratio: the one a scaling sweep fitted on the same data and
tokenizer where there is one (`llmforge scale`, tasks/training/scaling/fit_record.py), else Chinchilla's 20;
it logs the shards the tokens were made from as the run's training dataset (infra/tracking/datasets.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from infra.config import ConfigError
from infra.stages import DS_CONFIG_FILE, Launch, recorded_inputs
from infra.tracking.datasets import log_shards_input
from infra.tracking.runs import active_run, log_artifact, log_artifacts, log_metrics, log_text, set_tag
from models.bpb import nats_and_bytes, token_bytes
from models.export import load_config
from models.flops import ChinchillaReport, chinchilla, num_params
from models.llama import ModelConfig, Transformer, model_config
from models.losses import next_token_loss, token_logprobs
from tasks.tokenizer.tokenize_shards import load_token_index, load_token_split, unigram_perplexity
from tasks.tokenizer.train import load_tokenizer
from tasks.training.batches import token_window_batches
from tasks.training.config import PretrainConfig, seq_len_problem
from tasks.training.loop import LossSteps
from tasks.training.scaling.fit_record import find_fit
from tasks.training.stage import ExportedModel, TrainingStage, exported, launch_of, publish
from tasks.training.types import TrainResult


class PretrainBaselines(BaseModel):
    """What the run is measured against, on the stage side after it: the tokenizer's unigram baseline on the same
    validation tokens, and the compute-optimal tokens per parameter (all parameters counted, as Chinchilla counts)."""

    unigram_ppl: float
    tokens_per_param: float
    optimal_tokens_per_param: float  # Chinchilla's, or the one a sweep on the same data and tokenizer fitted
    chinchilla: str  # the Chinchilla view in one line (models.flops.ChinchillaReport.summary)


class PretrainResult(ExportedModel):
    """What pretraining ended with: the contents of out_dir/result.json."""

    checkpoint: Path | None
    loss_curve: Path | None
    steps: int
    final_train_loss: float | None
    final_val_loss: float | None
    final_val_ppl: float | None
    final_val_bpb: float | None = None  # bits per byte on the same validation windows: compares across tokenizers
    tokens_seen: int
    train_tokens_per_s: float | None
    skipped_steps: int
    world_size: int
    n_params: int
    baselines: PretrainBaselines | None = None  # measured on the stage side after the run (`after`)


def lm_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy of a (inputs, targets) batch."""
    inputs, targets = batch
    return next_token_loss(model(inputs), targets)


def lm_nats_and_bytes(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
                      table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nats and UTF-8 bytes of a batch's predicted tokens (special tokens count neither): bits per byte's parts."""
    inputs, targets = batch
    return nats_and_bytes(-token_logprobs(model(inputs), targets), targets, table.to(targets.device))


def resolve_model_config(cfg: PretrainConfig, vocab_size: int) -> dict[str, Any]:
    """The architecture the ranks will build, checked here so a bad config fails before launching (the layout against
    the model's shape is checked when the config is read: tasks/training/config.py `layout_problem`)."""
    mcfg = model_config(cfg.model, vocab_size, **cfg.model_overrides)
    problem = seq_len_problem(cfg.batch.seq_len, mcfg.model_dump(), "pretrain")  # a config copied past its validators
    if problem:
        raise ValueError(problem)
    return mcfg.model_dump(mode="json")


def check_token_counts(cfg: PretrainConfig, train: int, val: int, val_fraction: float) -> None:
    """Enough tokens for what the pretraining asks, said before a launch: one micro-batch of distinct training
    windows, and validation tokens (the report's unigram baseline always; a window's worth with log.eval_every)."""
    b = cfg.batch
    windows = max(0, (train - 1) // b.seq_len)
    if windows < b.micro_batch_size:
        raise ConfigError(f"the corpus gives {train:,} training tokens: {windows} window(s) of pretrain.batch.seq_len="
                          f"{b.seq_len}, fewer than one micro-batch of pretrain.batch.micro_batch_size="
                          f"{b.micro_batch_size} ({b.micro_batch_size * (b.seq_len + 1):,} tokens); give the catalog "
                          "more documents, or lower pretrain.batch.micro_batch_size or pretrain.batch.seq_len")
    if val == 0 or (cfg.log.eval_every > 0 and val <= b.seq_len):
        raise ConfigError(f"the corpus gives {val:,} validation tokens (tokenize.val_fraction={val_fraction}), fewer "
                          f"than {'one' if val == 0 else f'one window of pretrain.batch.seq_len+1={b.seq_len + 1}'}: "
                          "the validation loss and the unigram baseline need them; give the catalog more documents "
                          "or raise tokenize.val_fraction"
                          + ("" if val == 0 else ", or set pretrain.log.eval_every=0 to train without validation"))


class Pretrain(TrainingStage):
    name, store, Config, Result = "pretrain", "checkpoints/pretrain", PretrainConfig, PretrainResult
    inputs = ("tokens", "tokenizer")
    config: PretrainConfig

    # ------------------------------------------------------------------------- stage side

    def prepare(self, inputs: dict[str, Path | None], out_dir: Path) -> Launch:
        tokens_dir, tokenizer_path = Path(inputs["tokens"]), Path(inputs["tokenizer"])
        index = load_token_index(tokens_dir)
        vocab_size = load_tokenizer(tokenizer_path).get_vocab_size()
        if index.vocab_size > vocab_size:
            raise ValueError(f"{tokens_dir} was tokenized with a {index.vocab_size}-token vocabulary but "
                             f"{tokenizer_path} has {vocab_size}; re-tokenize with this tokenizer")
        architecture = resolve_model_config(self.config, vocab_size)
        check_token_counts(self.config, index.tokens("train"), index.tokens("val"), index.val_fraction)
        b = self.config.batch
        return launch_of(self.config, b.micro_batch_size, b.grad_accum, extra={"architecture": architecture},
                                identity={"model": architecture})

    def after(self, result: PretrainResult, inputs: dict[str, Path | None]) -> PretrainResult:
        """The unigram baseline and the Chinchilla view, logged with the run's configs, tokenizer, model and shards."""
        tokens_dir = Path(inputs["tokens"])
        log_data_input(tokens_dir)
        unigram = unigram_perplexity(tokens_dir)
        view = chinchilla_view(result, tokens_dir)
        metrics = {"unigram_ppl": unigram, "tokens_per_param": view.tokens_per_param,
                   "optimal_tokens_per_param": view.optimal_ratio}
        if result.final_val_ppl is not None:
            metrics["val_ppl_over_unigram"] = result.final_val_ppl / unigram
        log_metrics(metrics)
        log_artifact(Path(inputs["tokenizer"]), artifact_path="tokenizer")
        log_text(json.dumps(load_token_index(tokens_dir).model_dump(mode="json"), indent=2), "pretrain/token_index.json")
        for name in (self.config_file, DS_CONFIG_FILE):
            if (result.out_dir / name).is_file():
                log_artifact(result.out_dir / name, artifact_path="pretrain")
        log_artifacts(result.model_dir, artifact_path="model")  # safetensors + config.json
        if view.warning:
            set_tag("chinchilla.warning", view.warning)
        baselines = PretrainBaselines(unigram_ppl=unigram, tokens_per_param=view.tokens_per_param,
                                      optimal_tokens_per_param=view.optimal_ratio, chinchilla=view.summary())
        return result.model_copy(update={"baselines": baselines})

    # ------------------------------------------------------------------------- rank side

    def model(self) -> torch.nn.Module:
        # Same seed on every rank: identical initial weights before DeepSpeed broadcasts/partitions them.
        torch.manual_seed(self.config.seed)
        return Transformer(ModelConfig(**self.job.extra["architecture"]))

    def shape(self) -> dict[str, int]:
        b = self.config.batch
        return {"micro_batch_size": b.micro_batch_size, "grad_accum": b.grad_accum, "seq_len": b.seq_len}

    def steps(self, rank: int, world: int) -> LossSteps:
        """`lm_loss` over the train windows; validation on the val split unless it is shorter than a window."""
        cfg, tokens_dir = self.config, self.job.inputs["tokens"]
        seq_len, rows = cfg.batch.seq_len, cfg.batch.micro_batch_size
        # Checked against index.json's sha256 so a same-size bit flip is caught before training.
        train_tokens = load_token_split(tokens_dir, "train", verify_sha256=True)
        val_tokens = load_token_split(tokens_dir, "val", verify_sha256=True)
        eval_batches = None
        if len(val_tokens) > seq_len:
            eval_batches = token_window_batches(val_tokens, seq_len, rows, cfg.seed + 1)
        elif rank == 0:
            print(f"val split has {len(val_tokens)} tokens, fewer than seq_len+1={seq_len + 1}: no validation loss")
        table = torch.as_tensor(token_bytes(load_tokenizer(self.job.inputs["tokenizer"])))
        return LossSteps(cfg, token_window_batches(train_tokens, seq_len, rows, cfg.seed), eval_batches, lm_loss,
                         bpb_fn=lambda model, batch: lm_nats_and_bytes(model, batch, table))

    def finish(self, trained: TrainResult, run: Any, rank: int, world: int) -> None:
        done = exported(trained, self.job, rank, self.config.launch.zero, self.config.export_hf,
                               "Pretraining loss")
        if done is None:
            return
        out = PretrainResult(
            out_dir=self.job.out_dir, model_dir=done.model_dir, hf_dir=done.hf_dir, checkpoint=trained.checkpoint,
            loss_curve=done.loss_curve, mlflow_run_id=run.info.run_id, steps=trained.steps,
            final_train_loss=trained.final_train_loss, final_val_loss=trained.final_val_loss,
            final_val_ppl=trained.final_val_ppl, final_val_bpb=trained.final_val_bpb, tokens_seen=trained.tokens_seen,
            train_tokens_per_s=trained.train_tokens_per_s, skipped_steps=trained.skipped_steps, world_size=world,
            n_params=done.n_params,
        )
        final = {"final_train_loss": out.final_train_loss, "final_val_loss": out.final_val_loss,
                 "final_val_ppl": out.final_val_ppl, "final_val_bpb": out.final_val_bpb,
                 "tokens_seen": float(out.tokens_seen), "train_tokens_per_s": out.train_tokens_per_s,
                 "n_params": float(out.n_params)}
        publish(run, self.job.out_dir, out, final, trained.steps, [done.loss_curve], trained.memory)


def log_data_input(tokens_dir: Path) -> None:
    """The shards manifest `tokens_dir` was tokenized from (its record's `manifest` input: TokenizeShards') as the
    active run's training dataset; a line when the folder names none (tokens no stage wrote)."""
    manifest = recorded_inputs(tokens_dir).get("manifest")
    if manifest is None or not manifest.is_file():
        print(f"no dataset input logged: {tokens_dir} names no data manifest it was tokenized from")
        return
    log_shards_input(active_run().info.run_id, manifest)


def chinchilla_view(result: PretrainResult, tokens_dir: Path) -> ChinchillaReport:
    """The run's tokens per parameter (all parameters, as Chinchilla counts them) against the compute-optimal ratio:
    the one a sweep fitted on the same data and tokenizer (tasks/training/scaling/fit_record.py), else Chinchilla's."""
    n_params = num_params(load_config(result.model_dir))
    fit = find_fit(tokens_dir) if result.tokens_seen else None
    if fit is None:
        return chinchilla(n_params=n_params, tokens=result.tokens_seen)
    ratio = fit.optimal_ratio(6.0 * n_params * result.tokens_seen)
    return chinchilla(n_params=n_params, tokens=result.tokens_seen, optimal_ratio=ratio.estimate,
                      ratio_source=fit.source(ratio))
