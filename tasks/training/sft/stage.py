"""Supervised fine-tuning: loss on the assistant tokens of chat examples, on DeepSpeed ranks.

    sft = run(Sft(config.sft), ws, base=base_model_dir, tokenizer=tokenizer_json, tokens=tokens_dir,
              task=config.arithmetic)
      out_dir/sft_config.json    resolved config
      out_dir/ds_config.json     the DeepSpeed config the ranks train with
      out_dir/rejected.jsonl     SFT records that did not become examples, with their reason
      out_dir/checkpoints/       DeepSpeed checkpoints; a rerun into the same out_dir resumes
      out_dir/model/             fine-tuned weights (models.export.save_model), out_dir/hf/ for transformers
      out_dir/loss_curve.png, out_dir/result.json

Examples come from tasks/training/sft/data.py (the built-in docstring + arithmetic sets, or an SFT
catalog folder), are encoded with the one chat template and trained on by the one loop with
`LossSteps` of `sft_loss`; the loss covers only assistant tokens (prompt and padding have target
-100). With `replay_fraction`, that share of each micro-batch's rows are windows of the
pretraining token shards (`tokens`), trained with next-token loss on every token so the model
keeps the language modelling it was pretrained for; the two losses are logged apart
(sft_loss, replay_loss) and the step's loss weighs them by their rows.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infra.stages import Launch
from infra.workspace.atomic import write_text_atomic
from models.chat_template import ChatEncoding, collate, encode_chat, special_ids
from models.export import load_model
from models.losses import next_token_loss
from tasks.eval.arithmetic import ArithmeticTask
from tasks.tokenizer.tokenize_shards import load_token_index, load_token_split
from tasks.tokenizer.train import load_tokenizer
from tasks.training.batches import epoch_orders, token_window_batches
from tasks.training.config import SftConfig, SftDataConfig, seq_len_problem
from tasks.training.loop import LossSteps
from tasks.training.metrics import perplexity
from tasks.training.sft.data import SftExample, SftSourceConfig, load_sft_catalog, load_sft_examples
from tasks.training.stage import ExportedModel, TrainingStage, exported, launch_of, publish, saved_model_config
from tasks.training.types import BatchFn, LossParts, TrainResult

REJECTED_FILE = "rejected.jsonl"


class SftResult(ExportedModel):
    """What SFT ended with: the contents of out_dir/result.json."""

    checkpoint: Path | None
    loss_curve: Path | None
    rejected_path: Path
    steps: int
    final_train_loss: float | None
    final_val_loss: float | None  # on the held-out SFT examples' assistant tokens
    # Next-token loss on the pretraining validation split at the last validation, when replaying.
    final_replay_val_loss: float | None = None
    final_replay_val_ppl: float | None = None
    train_tokens_per_s: float | None
    skipped_steps: int
    world_size: int
    examples_train: int
    examples_val: int
    examples_by_source: dict[str, int]
    rejected: dict[str, int]  # reason -> count (reading and encoding rejections together)


# ----------------------------------------------------------------------------- data


def sft_sources(data: SftDataConfig) -> list[SftSourceConfig]:
    """The SFT sources `data` selects, with its arithmetic options and example cap applied."""
    if data.catalog is not None:
        sources = load_sft_catalog(data.catalog)
    else:
        licences = {"stdlib_docstrings": "PSF-2.0", "arithmetic": "CC0-1.0"}
        sources = [SftSourceConfig(name=b, kind="sft_builtin", builtin=b, licence=licences[b]) for b in data.builtin]
    if data.sources is not None:
        known = {s.name for s in sources}
        missing = sorted(set(data.sources) - known)
        if missing:
            raise ValueError(f"SFT sources {missing} are not defined; known: {sorted(known)}")
        sources = [s for s in sources if s.name in data.sources]
    out = []
    for s in sources:
        update: dict[str, Any] = {}
        if data.max_examples is not None:
            update["max_examples"] = data.max_examples
        if data.arithmetic is not None and s.builtin == "arithmetic":
            update["arithmetic"] = data.arithmetic
        out.append(s.model_copy(update=update))
    if not out:
        raise ValueError("no SFT sources selected; check data.builtin / data.sources")
    return out


def is_val_example(example_id: str, val_fraction: float) -> bool:
    """Stable train/val assignment by hash of the example id."""
    digest = hashlib.sha256(f"sft-val\x1f{example_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


def is_held_out(example: SftExample, val_fraction: float) -> bool:
    """Validation, not training: made for validation only, or drawn by the hash of its id."""
    return example.held_out or is_val_example(example.example_id, val_fraction)


def encode_examples(
    tokenizer: Any, examples: Sequence[SftExample], seq_len: int
) -> tuple[list[ChatEncoding], list[SftExample], list[dict]]:
    """(encodings, their examples, rejected rows) with the chat template.

    An example longer than seq_len + 1 tokens is rejected (`exceeds_seq_len`) rather than
    truncated: a cut answer would teach the model to stop mid-sentence without <|end|>.
    """

    encs, kept, rejected = [], [], []
    for ex in examples:
        row = {"source": ex.source, "path": ex.path, "locator": ex.locator}
        try:
            enc = encode_chat(tokenizer, ex.messages)
        except ValueError as exc:
            rejected.append({**row, "reason": "encode_error", "detail": str(exc)[:200]})
            continue
        if len(enc.ids) > seq_len + 1:
            rejected.append({**row, "reason": "exceeds_seq_len", "detail": f"{len(enc.ids)} tokens > seq_len + 1 = {seq_len + 1}"})
            continue
        encs.append(enc)
        kept.append(ex)
    return encs, kept, rejected


def chat_batches(encodings: Sequence[ChatEncoding], batch_size: int, pad_id: int, seq_len: int, seed: int) -> BatchFn:
    """Micro-batch i of a rank: `batch_size` encoded conversations collated to (inputs, targets).

    Each epoch visits every example once in an order drawn from (seed, epoch); sample
    number g = (i * world + rank) * batch_size + j, so a batch is a pure function of
    (seed, i, rank, world) and a resume continues mid-epoch. Targets are -100 on prompt
    tokens and padding.
    """
    n = len(encodings)
    if n < 1:
        raise ValueError("no encoded SFT examples to batch; check the data selection and seq_len")
    order = epoch_orders(n, seed)

    def batch(i: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = (i * world + rank) * batch_size
        picked = [encodings[int(order(g // n)[g % n])] for g in range(first, first + batch_size)]
        return collate(picked, pad_id, seq_len)

    return batch


def replay_mix(chat: BatchFn, replay: BatchFn) -> BatchFn:
    """Micro-batch i as {"chat": chat(i, ...), "replay": replay(i, ...)}: both pure, so the mix is too.

    The two kinds stay separate tensors, each padded to its own width: a conversation of a
    dozen tokens is not padded to a full pretraining window.
    """

    def batch(i: int, rank: int, world: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {"chat": chat(i, rank, world), "replay": replay(i, rank, world)}

    return batch


SftBatch = tuple[torch.Tensor, torch.Tensor] | dict[str, tuple[torch.Tensor, torch.Tensor]]


def sft_batch_tokens(batch: SftBatch) -> int:
    """Positions the model computes for a collated (or replay-mixed) batch, padding included (it costs the same FLOPs).

    Batches are padded to their longest row, not to seq_len, so counting seq_len per row
    would report tokens/s (and MFU) for work that never ran.
    """
    if isinstance(batch, dict):
        return sum(inputs.numel() for inputs, _ in batch.values())
    return batch[0].numel()


def sft_loss(model: torch.nn.Module, batch: SftBatch) -> torch.Tensor | tuple[torch.Tensor, LossParts]:
    """Cross-entropy on the assistant tokens of a collated (inputs, targets) batch.

    For a replay mix, also next-token loss on every replayed token; the two means are weighted
    by their share of the rows and come back as parts too (sft_loss, replay_loss).
    """
    if not isinstance(batch, dict):
        inputs, targets = batch
        return next_token_loss(model(inputs), targets)
    (chat_in, chat_tgt), (replay_in, replay_tgt) = batch["chat"], batch["replay"]
    chat = next_token_loss(model(chat_in), chat_tgt)
    replay = next_token_loss(model(replay_in), replay_tgt)
    n_chat, n_replay = chat_in.shape[0], replay_in.shape[0]
    loss = (n_chat * chat + n_replay * replay) / (n_chat + n_replay)
    return loss, {"sft_loss": chat.detach(), "replay_loss": replay.detach()}


@dataclass
class SftExamples:
    """The encoded examples of a run, split by hash into train and val, and what was rejected."""

    train: list[ChatEncoding]
    val: list[ChatEncoding]
    kept: list[SftExample]  # train and val, in catalog order
    rejected: list[dict]  # reading and encoding rejections, with their reason


def load_examples(cfg: SftConfig, tokenizer: Any, seq_len: int, task: ArithmeticTask | None = None) -> SftExamples:
    """Read the selected sources (the built-in arithmetic set from `task`), encode with the chat template, split
    train/val; fails when no train example is left."""
    root = cfg.data.catalog if cfg.data.catalog is not None else Path(".")
    examples, rejected = load_sft_examples(sft_sources(cfg.data), root=root, task=task)
    encodings, kept, enc_rejected = encode_examples(tokenizer, examples, seq_len)
    rejected += enc_rejected
    is_val = [is_held_out(ex, cfg.data.val_fraction) for ex in kept]
    train_enc = [e for e, v in zip(encodings, is_val) if not v]
    val_enc = [e for e, v in zip(encodings, is_val) if v]
    if not train_enc:
        raise ValueError(f"no SFT training examples left ({len(examples)} read, {len(rejected)} rejected, "
                         f"{len(val_enc)} held out); check data selection, seq_len={seq_len} and val_fraction")
    return SftExamples(train_enc, val_enc, kept, rejected)


def write_rejected(rows: list[dict], path: Path) -> Path:
    """One JSON line per rejected record."""
    return write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def example_batches(data: SftExamples, cfg: SftConfig, pad: int, replay_rows: int = 0,
                    replay_tokens_dir: Path | None = None, rank: int = 0) -> tuple[BatchFn, BatchFn | None]:
    """Train and (when any example is held out) validation batches.

    With `replay_rows`, each micro-batch holds that many windows of the pretraining token shards
    (train split; val split for validation) beside micro_batch_size - replay_rows examples.
    """
    seq_len, seed = cfg.batch.seq_len, cfg.seed
    n_chat = cfg.batch.micro_batch_size - replay_rows
    train_batches = chat_batches(data.train, n_chat, pad, seq_len, seed)
    eval_batches = chat_batches(data.val, n_chat, pad, seq_len, seed + 1) if data.val else None
    if not replay_rows:
        return train_batches, eval_batches

    if replay_tokens_dir is None:
        raise ValueError(f"{replay_rows} replay rows per micro-batch but no replay_tokens_dir in the job")
    # Other seeds than pretraining's, so the replay does not retrace its first steps window for window.
    train_tokens = load_token_split(replay_tokens_dir, "train", verify_sha256=True)
    train_batches = replay_mix(train_batches, token_window_batches(train_tokens, seq_len, replay_rows, seed + 2))
    val_tokens = load_token_split(replay_tokens_dir, "val", verify_sha256=True)
    if eval_batches is not None and len(val_tokens) > seq_len:
        eval_batches = replay_mix(eval_batches, token_window_batches(val_tokens, seq_len, replay_rows, seed + 3))
    elif rank == 0:
        print(f"replay: val split has {len(val_tokens)} tokens (seq_len + 1 = {seq_len + 1} needed) or no SFT "
              "example is held out: validation without replayed text")
    return train_batches, eval_batches


def check_replay_tokens(cfg: SftConfig, replay_tokens: Path | None, vocab_size: int) -> Path | None:
    """The absolute token-shard folder to replay, checked against the model; None when replay is off."""
    if cfg.replay_fraction == 0:
        return None
    if replay_tokens is None:
        raise ValueError(f"replay_fraction={cfg.replay_fraction} replays pretraining text but no token shards were "
                         "given; pass the pretraining token folder (replay_tokens / the flow's `tokens`), "
                         "or set replay_fraction: 0")
    index = load_token_index(Path(replay_tokens))  # names the missing index.json when the folder is not one
    if index.vocab_size > vocab_size:
        raise ValueError(f"{replay_tokens} was tokenized with a {index.vocab_size}-token vocabulary but the base "
                         f"model has {vocab_size}; replay the token shards the base model was pretrained on")
    return Path(replay_tokens).resolve()


class Sft(TrainingStage):
    name, store, Config, Result = "sft", "checkpoints/sft", SftConfig, SftResult
    # tokens: the pretraining shards replay_fraction replays (may be None); task: the arithmetic task the built-in
    # arithmetic set draws from (the pipeline's `arithmetic:` section).
    inputs = ("base", "tokenizer", "tokens", "task")
    config: SftConfig

    # ------------------------------------------------------------------------- stage side

    def prepare(self, inputs: dict[str, Any], out_dir: Path) -> Launch:
        cfg, base, task = self.config, Path(inputs["base"]), ArithmeticTask.model_validate(inputs["task"])
        mcfg = saved_model_config(base, Path(inputs["tokenizer"]), "fine-tune a model trained with this tokenizer")
        problem = seq_len_problem(cfg.batch.seq_len, mcfg.model_dump(), "sft")  # the saved base's, whatever made it
        if problem:
            raise ValueError(problem)
        if cfg.data.catalog is not None and not Path(cfg.data.catalog).is_dir():
            raise FileNotFoundError(f"data.catalog={cfg.data.catalog} is not a folder of sft_* YAML definitions")
        replay = check_replay_tokens(cfg, inputs.get("tokens"), mcfg.vocab_size)
        for source in sft_sources(cfg.data):  # the sums each arithmetic set asks exist in the task's ranges
            if source.builtin == "arithmetic":
                source.arithmetic.check(task, f"SFT source '{source.name}' arithmetic")
        catalog = str(Path(cfg.data.catalog).resolve()) if cfg.data.catalog is not None else None
        return launch_of(cfg, cfg.batch.micro_batch_size, cfg.batch.grad_accum, extra={"catalog": catalog},
                         identity={"base_model": str(base.resolve()), "model": mcfg.model_dump(mode="json"),
                                   "replay_tokens": str(replay) if replay else None,
                                   "arithmetic": task.model_dump(mode="json")})

    # ------------------------------------------------------------------------- rank side

    def model(self) -> torch.nn.Module:
        # The optimizer keeps fp32 masters; bf16 runs cast through DeepSpeed.
        return load_model(self.job.inputs["base"]).float()

    def shape(self) -> dict[str, int]:
        b = self.config.batch
        return {"micro_batch_size": b.micro_batch_size, "grad_accum": b.grad_accum, "seq_len": b.seq_len}

    def steps(self, rank: int, world: int) -> LossSteps:

        cfg = self.config
        tokenizer = load_tokenizer(self.job.inputs["tokenizer"])
        catalog = self.job.extra.get("catalog")
        data_cfg = cfg.data.model_copy(update={"catalog": Path(catalog) if catalog else None})
        task = ArithmeticTask.model_validate(self.job.values["task"])
        self.data = load_examples(cfg.model_copy(update={"data": data_cfg}), tokenizer, cfg.batch.seq_len, task)
        replay_dir = self.job.inputs.get("tokens") if cfg.replay_rows else None
        if rank == 0:
            reasons = dict(Counter(r["reason"] for r in self.data.rejected))
            write_rejected(self.data.rejected, self.job.out_dir / REJECTED_FILE)
            print(f"SFT examples: {len(self.data.train)} train, {len(self.data.val)} val, "
                  f"{len(self.data.rejected)} rejected ({reasons})")
            if cfg.replay_rows:
                print(f"replay: {cfg.replay_rows} of {cfg.batch.micro_batch_size} rows per micro-batch are windows of "
                      f"{cfg.batch.seq_len} pretraining tokens from {replay_dir}")
        train_batches, eval_batches = example_batches(self.data, cfg, special_ids(tokenizer).pad, cfg.replay_rows,
                                                      replay_dir, rank)
        return LossSteps(cfg, train_batches, eval_batches, sft_loss, sft_batch_tokens)

    def finish(self, trained: TrainResult, run: Any, rank: int, world: int) -> None:
        title = "SFT loss (assistant tokens" + (", replayed pretraining text)" if self.config.replay_rows else ")")
        done = exported(trained, self.job, rank, self.config.launch.zero, self.config.export_hf, title)
        if done is None:
            return
        data, out_dir = self.data, self.job.out_dir
        replay_val = trained.final_val_parts.get("replay_loss")
        out = SftResult(
            out_dir=out_dir, model_dir=done.model_dir, hf_dir=done.hf_dir, checkpoint=trained.checkpoint,
            loss_curve=done.loss_curve, rejected_path=out_dir / REJECTED_FILE, mlflow_run_id=run.info.run_id,
            steps=trained.steps, final_train_loss=trained.final_train_loss,
            final_val_loss=trained.final_val_parts.get("sft_loss", trained.final_val_loss),
            final_replay_val_loss=replay_val,
            final_replay_val_ppl=perplexity(replay_val) if replay_val is not None else None,
            train_tokens_per_s=trained.train_tokens_per_s, skipped_steps=trained.skipped_steps, world_size=world,
            examples_train=len(data.train), examples_val=len(data.val),
            examples_by_source=dict(sorted(Counter(ex.source for ex in data.kept).items())),
            rejected=dict(sorted(Counter(r["reason"] for r in data.rejected).items())),
        )
        final = {"final_train_loss": out.final_train_loss, "final_val_loss": out.final_val_loss,
                 "final_replay_val_loss": out.final_replay_val_loss, "final_replay_val_ppl": out.final_replay_val_ppl,
                 "examples_train": float(out.examples_train), "examples_val": float(out.examples_val),
                 "examples_rejected": float(len(data.rejected))}
        publish(run, out_dir, out, final, trained.steps, [out.rejected_path, done.loss_curve], trained.memory)
