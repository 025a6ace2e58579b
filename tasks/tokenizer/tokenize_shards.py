"""Tokenize the Parquet shards into flat token files that pretraining memory-maps.

Output folder:
  train.bin, val.bin  every document's token ids followed by EOS, back to back
                      (little-endian uint16 when the vocabulary fits, else uint32)
  index.json          `TokenShards`: dtype, counts, checksums, lineage; written last,
                      so a folder without it is an incomplete run

A document goes to val when a hash of its doc_id falls below `val_fraction`: the split
is the same on every rerun, does not depend on shard order, and puts every up-sampled
copy of a document on the same side (no train/val leakage through the mix).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from infra.config import StrictModel
from infra.stages import Stage
from infra.workspace.atomic import atomic_path, commit_atomic, write_text_atomic
from infra.workspace.record import sha256_file
from models.special_tokens import EOS
from tasks.data.documents import iter_batches
from tasks.data.manifest import ChecksumError, shard_paths
from tasks.tokenizer.train import TOKENIZER_FILE, load_tokenizer, special_token_ids

INDEX_FILE = "index.json"
SPLITS = ("train", "val")
_HASH_SPACE = float(1 << 64)


class TokenizeConfig(StrictModel):
    val_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    batch_size: int = Field(default=1024, gt=0)  # documents per encode_batch call


class TokenFile(BaseModel):
    file: str  # relative to the index's folder
    tokens: int
    bytes: int
    sha256: str


class SourceCount(BaseModel):
    documents: int = 0  # rows, so an up-sampled document counts once per copy
    tokens: int = 0  # including each document's EOS, so they sum to the file's tokens


class TokenShards(BaseModel):
    """Contents of index.json: what the tokenize stage wrote and what it was made from."""

    dtype: str  # numpy dtype name of the .bin files (stored little-endian)
    vocab_size: int
    eos_id: int
    val_fraction: float
    tokenizer_sha256: str
    manifest_sha256: str
    files: dict[str, TokenFile]  # split -> file
    sources: dict[str, dict[str, SourceCount]]  # split -> source -> counts

    def tokens(self, split: str) -> int:
        return self.files[split].tokens

    def documents(self, split: str) -> int:
        return sum(c.documents for c in self.sources.get(split, {}).values())


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every id (uint16 up to 65536 ids), little-endian."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def val_mask(doc_ids: pa.Array | list[str], val_fraction: float) -> np.ndarray:
    """True where a document belongs to val: blake2b(doc_id) as a fraction of 2**64, below `val_fraction`."""
    ids = doc_ids.to_pylist() if isinstance(doc_ids, (pa.Array, pa.ChunkedArray)) else doc_ids
    # One hash per document (not per token); blake2b because Python's hash() is salted per process.
    keys = np.fromiter(
        (int.from_bytes(hashlib.blake2b(d.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big") for d in ids),
        dtype=np.uint64,
        count=len(ids),
    )
    return keys.astype(np.float64) / _HASH_SPACE < val_fraction


def tokenize_shards(manifest_path: Path, tokenizer_path: Path, out_dir: Path, cfg: TokenizeConfig) -> TokenShards:
    """Encode every shard document into `out_dir/{train,val}.bin` plus `index.json`; return the index."""
    manifest_path = Path(manifest_path)
    manifest_file = manifest_path / "manifest.json" if manifest_path.is_dir() else manifest_path
    paths = shard_paths(manifest_path)  # raises ChecksumError naming a corrupted shard
    tokenizer_path = Path(tokenizer_path)
    tokenizer_file = tokenizer_path / TOKENIZER_FILE if tokenizer_path.is_dir() else tokenizer_path
    tokenizer = load_tokenizer(tokenizer_file)
    # Document text that happens to contain "<|eos|>" must stay text, not become a real separator.
    tokenizer.encode_special_tokens = True
    eos_id = special_token_ids(tokenizer, origin=str(tokenizer_file))[EOS]
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Withdraw the old completion marker first: from here until the new index is written
    # the folder reads as incomplete, never as an old index over new files.
    (out_dir / INDEX_FILE).unlink(missing_ok=True)

    writers = {split: _TokenWriter(out_dir / f"{split}.bin") for split in SPLITS}
    sources: dict[str, dict[str, SourceCount]] = {split: {} for split in SPLITS}
    try:
        for batch in _document_batches(paths, cfg.batch_size):
            is_val = val_mask(batch.column("doc_id"), cfg.val_fraction)
            for split, mask in (("train", ~is_val), ("val", is_val)):
                if not mask.any():
                    continue
                part = batch.filter(pa.array(mask))
                tokens, lengths = _encode(tokenizer, part.column("text").to_pylist(), eos_id, dtype)
                writers[split].write(tokens)
                _count(sources[split], part.column("source").to_pylist(), lengths)
        files = {split: w.commit(out_dir) for split, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise

    index = TokenShards(
        dtype=dtype.name,
        vocab_size=vocab_size,
        eos_id=eos_id,
        val_fraction=cfg.val_fraction,
        tokenizer_sha256=sha256_file(tokenizer_file),
        manifest_sha256=sha256_file(manifest_file),
        files=files,
        sources={split: dict(sorted(c.items())) for split, c in sources.items()},
    )
    _write_index(index, out_dir / INDEX_FILE)
    return index


def _document_batches(paths: list[Path], batch_size: int) -> Iterator[pa.RecordBatch]:
    for path in paths:
        yield from iter_batches(path, batch_size, columns=["doc_id", "source", "text"])


def _encode(tokenizer, texts: list[str], eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Encode texts on the Rust thread pool; return the flat ids with EOS after each document, and per-document lengths (with EOS)."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # _fast skips offsets we do not use
    ids = [e.ids for e in encode(texts, add_special_tokens=False)]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return np.insert(flat, np.cumsum(lengths), np.array(eos_id, dtype=dtype)), lengths + 1


def _count(counts: dict[str, SourceCount], sources: list[str], lengths: np.ndarray) -> None:
    for source, n in zip(sources, lengths.tolist()):
        c = counts.setdefault(source, SourceCount())
        c.documents += 1
        c.tokens += n


class _TokenWriter:
    """Append token arrays to a temporary file, hashing as it goes; rename into place on commit."""

    def __init__(self, final: Path):
        self.final = final
        self.tmp = atomic_path(final)
        self.fh = open(self.tmp, "wb")
        self.sha = hashlib.sha256()
        self.tokens = 0

    def write(self, tokens: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(tokens)).cast("B")
        self.fh.write(data)
        self.sha.update(data)
        self.tokens += len(tokens)

    def commit(self, root: Path) -> TokenFile:
        self.fh.close()
        size = self.tmp.stat().st_size
        commit_atomic(self.tmp, self.final)
        return TokenFile(file=str(self.final.relative_to(root)), tokens=self.tokens, bytes=size, sha256=self.sha.hexdigest())

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


def _write_index(index: TokenShards, path: Path) -> None:
    write_text_atomic(path, index.model_dump_json(indent=2))


def load_token_index(out_dir: Path) -> TokenShards:
    """Read index.json; its absence means the tokenize stage did not finish."""
    path = Path(out_dir) / INDEX_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing, so the token shards in {out_dir} are incomplete; rerun the tokenize stage")
    return TokenShards.model_validate_json(path.read_text())


def load_token_split(out_dir: Path, split: str, verify_sha256: bool = False) -> np.ndarray:
    """Memory-map one split's token ids (read-only), after checking its size (and optionally sha256) against index.json.

    An empty split comes back as a zero-length array, since an empty file cannot be mapped.
    """
    index = load_token_index(out_dir)
    if split not in index.files:
        raise ValueError(f"split '{split}' is not in {Path(out_dir) / INDEX_FILE}; choose one of {sorted(index.files)}")
    info = index.files[split]
    path = Path(out_dir) / info.file
    dtype = np.dtype(index.dtype).newbyteorder("<")
    expected = info.tokens * dtype.itemsize
    actual = path.stat().st_size if path.is_file() else None
    if actual != expected:
        raise ChecksumError(
            f"{path}: {actual if actual is not None else 'missing'} bytes, index.json records {expected}; "
            "the file is truncated or from another run; rerun the tokenize stage"
        )
    if verify_sha256 and sha256_file(path) != info.sha256:
        raise ChecksumError(f"{path}: sha256 differs from index.json; the file is corrupted; rerun the tokenize stage")
    if info.tokens == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(info.tokens,))


def token_counts(tokens: np.ndarray, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """How often each id in [0, vocab_size) occurs, via np.bincount over chunks (bounded memory on a memmap)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(tokens), chunk):  # bincount needs an int copy; chunks keep it small
        c = np.bincount(np.asarray(tokens[start : start + chunk]), minlength=vocab_size)
        if len(c) > vocab_size:
            raise ValueError(f"token id {len(c) - 1} is outside vocab_size={vocab_size}; the tokens and the vocabulary do not match")
        counts += c
    return counts


def unigram_perplexity_of(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Perplexity on `val` of the unigram model fitted on `train` with add-one smoothing over the vocabulary."""
    if len(val) == 0:
        raise ValueError("no validation tokens; set val_fraction > 0 and rerun the tokenize stage")
    train_counts = token_counts(train, vocab_size)
    log_p = np.log(train_counts + 1.0) - np.log(float(train_counts.sum() + vocab_size))
    nll = -(token_counts(val, vocab_size) @ log_p) / len(val)
    return float(np.exp(nll))


def unigram_perplexity(out_dir: Path) -> float:
    """Val perplexity of a unigram model fitted on the train tokens: the baseline pretraining must beat."""
    index = load_token_index(out_dir)
    return unigram_perplexity_of(load_token_split(out_dir, "train"), load_token_split(out_dir, "val"), index.vocab_size)


class TokenizeShards(Stage):
    """The manifest's shards as token files with train/val splits: work/tokens/<key>/."""

    name, store, Config, Result = "tokenize_shards", "tokens", TokenizeConfig, TokenShards
    inputs = ("manifest", "tokenizer")

    def compute(self, inputs: dict, out_dir: Path) -> TokenShards:
        return tokenize_shards(inputs["manifest"], inputs["tokenizer"], out_dir, self.config)
