"""Train the byte-level BPE tokenizer on the shard texts.

Byte-level (GPT-2 style) so that every string round-trips: the initial alphabet holds
all 256 bytes even when the corpus does not, and there is no normaliser to lose
information. The special tokens of `models.special_tokens` take ids 0..5 in their
listed order; no post-processor is set, since the token-shard and chat stages add
BOS/EOS themselves.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from pydantic import Field
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from infra.config import ConfigError, StrictModel
from infra.stages import Stage
from infra.workspace.atomic import atomic_write
from models.special_tokens import SPECIAL_TOKENS
from tasks.data.documents import iter_batches
from tasks.data.manifest import load_manifest, shard_paths

TOKENIZER_FILE = "tokenizer.json"
_BYTE_ALPHABET = 256
_READ_BATCH = 4096  # rows per Parquet record batch handed to the trainer


class TokenizerConfig(StrictModel):
    # The vocabulary must at least hold the special tokens and the 256 byte symbols.
    vocab_size: int = Field(default=4096, ge=len(SPECIAL_TOKENS) + _BYTE_ALPHABET)
    min_frequency: int = Field(default=2, ge=1)
    max_documents: int | None = Field(default=None, gt=0)  # sample cap for training speed
    seed: int = 0  # which documents the sample cap picks
    # One token per digit (as Llama and Mistral do): a number's digits then mean the same
    # thing in every number, which is what lets a small model add numbers it never saw.
    split_digits: bool = True


def train_tokenizer(manifest_path: Path, out_dir: Path, cfg: TokenizerConfig) -> Path:
    """Train a byte-level BPE on the manifest's shards; write `out_dir/tokenizer.json` atomically and return its path.

    Rows are read as the mix wrote them, so an up-sampled document weighs as much in
    the tokenizer's statistics as it will in pretraining.
    """
    paths = shard_paths(manifest_path)  # verifies every shard's sha256
    total_rows = sum(s.rows for s in load_manifest(manifest_path).shards)
    if total_rows == 0:
        raise ConfigError(f"the data flow kept no documents ({manifest_path} lists none): every document of the "
                          "catalog was empty, a duplicate, held out or filtered (its funnel says which); check the "
                          "catalog's sources and filters (`llmforge data` prints the funnel)")
    chosen = _sample_rows(total_rows, cfg)
    n_docs = total_rows if chosen is None else len(chosen)
    tokenizer = train_bpe(_text_batches(paths, chosen), cfg.vocab_size, cfg.min_frequency, cfg.split_digits, n_docs)

    final = Path(out_dir) / TOKENIZER_FILE
    with atomic_write(final) as tmp:
        tokenizer.save(str(tmp))
    return final


def train_bpe(texts: Iterable[str] | Iterable[list[str]], vocab_size: int, min_frequency: int = 0,
              split_digits: bool = False, length: int | None = None) -> Tokenizer:
    """A byte-level BPE trained on `texts` (strings, or batches of them; `length` documents, for
    the trainer's progress), with the special tokens at ids 0..5 in their listed order (checked)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = _pre_tokenizer(split_digits)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),  # the trainer adds these first, in order: ids 0..5
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    ids = special_token_ids(tokenizer)
    if list(ids.values()) != list(range(len(SPECIAL_TOKENS))):  # later stages rely on PAD=0, BOS=1, EOS=2, ...
        raise RuntimeError(f"special tokens got ids {ids}, expected 0..{len(SPECIAL_TOKENS) - 1} in listed order")
    return tokenizer


def _pre_tokenizer(split_digits: bool) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if not split_digits:
        return byte_level
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])


def _sample_rows(total_rows: int, cfg: TokenizerConfig) -> np.ndarray | None:
    """Sorted global row numbers to train on, or None for all rows."""
    if cfg.max_documents is None or cfg.max_documents >= total_rows:
        return None
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(total_rows, size=cfg.max_documents, replace=False))


def _text_batches(paths: list[Path], chosen: np.ndarray | None) -> Iterator[list[str]]:
    """Stream shard texts in batches (bounded memory), keeping only the `chosen` global rows."""
    offset = 0
    for path in paths:
        for batch in iter_batches(path, _READ_BATCH, columns=["text"]):
            texts = batch.column(0)
            n = len(texts)
            if chosen is not None:
                lo, hi = np.searchsorted(chosen, [offset, offset + n])
                texts = texts.take(chosen[lo:hi] - offset)
            offset += n
            if len(texts):
                yield texts.to_pylist()


def tokenizer_json(path: Path | None) -> Path | None:
    """The tokenizer.json of a tokenizer file or folder, or None when there is none."""
    if path is None:
        return None
    candidate = Path(path) / TOKENIZER_FILE if Path(path).is_dir() else Path(path)
    return candidate if candidate.is_file() else None


def load_tokenizer(path: Path) -> Tokenizer:
    """Load a trained tokenizer from its tokenizer.json (or the folder holding it), checking its special tokens."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer; train one first (tasks.tokenizer.train.train_tokenizer)")
    tokenizer = Tokenizer.from_file(str(path))
    special_token_ids(tokenizer, origin=str(path))
    return tokenizer


def special_token_ids(tokenizer: Tokenizer, origin: str = "tokenizer") -> dict[str, int]:
    """Map each special token (e.g. `models.special_tokens.EOS`) to its id; raise if one is missing."""
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    missing = [tok for tok, i in ids.items() if i is None]
    if missing:
        raise ValueError(
            f"{origin}: special token(s) {missing} are not in the vocabulary; "
            "retrain the tokenizer with tasks.tokenizer.train.train_tokenizer"
        )
    return ids  # type: ignore[return-value]


class TrainTokenizer(Stage):
    """A byte-level BPE tokenizer trained on the manifest's shards: work/tokenizer/<key>/; its path."""

    name, store, Config, Result = "train_tokenizer", "tokenizer", TokenizerConfig, Path
    inputs = ("manifest",)

    def compute(self, inputs: dict, out_dir: Path) -> Path:
        return train_tokenizer(inputs["manifest"], out_dir, self.config)
