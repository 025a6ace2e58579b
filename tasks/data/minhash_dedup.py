"""Near-duplicate removal with MinHash signatures and LSH banding (datasketch).

Signatures are computed batch-wise with numpy (hash every word n-gram shingle once,
apply all permutations as one broadcast, min-reduce per document) in worker
processes, and are bit-identical to `datasketch.MinHash(num_perm, seed=seed)`
updated with the same shingles as UTF-8. Shingles are taken of the text's dedup key
(tasks/data/text_normalize.py: invisible characters stripped, NFKC), the form exact dedup
compares, so a copy padded with zero-width spaces shares its words with the original.
The LSH index is datasketch's `MinHashLSH` over `LeanMinHash` sketches.

Keep rule (deterministic): documents are visited in input order; a document is
removed as "near_duplicate" when an already-kept LSH candidate has estimated
Jaccard >= threshold (`duplicate_of` = the most similar one, earliest on ties),
otherwise it is kept and indexed. Documents with no words are kept and never
indexed: the Jaccard similarity of empty sets is undefined, and exact dedup has
already dropped empty texts in the pipeline.

Signatures are computed in the data stages' one process pool (tasks/data/parallel.py),
whose spawned workers need the usual `if __name__ == "__main__":` guard in a script.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import LeanMinHash, MinHash, MinHashLSH
from prefect import task
from pydantic import Field, model_validator
from tqdm.auto import tqdm

from infra.config import StrictModel
from tasks.data import parallel
from tasks.data.documents import as_documents, iter_batches, removed_from_documents
from tasks.data.step import DataStep, StageResult
from tasks.data.text_normalize import dedup_key

T = TypeVar("T")

STAGE = "near_dedup"
REASON = "near_duplicate"

# datasketch's permutation schemes: its default since 2.0 is "affine32"; "legacy" is the
# (a*h + b) mod (2^61 - 1), truncated to 32 bits, of datasketch < 2.0.
Scheme = Literal["affine32", "affine64", "legacy"]
_MERSENNE_PRIME = np.uint64((1 << 61) - 1)
_MAX_HASH = {"affine32": np.uint32(0xFFFFFFFF), "affine64": np.uint64(0xFFFFFFFFFFFFFFFF), "legacy": np.uint64(0xFFFFFFFF)}
_DTYPE = {"affine32": np.uint32, "affine64": np.uint64, "legacy": np.uint64}
# MurmurHash3 finaliser (shift, multiplier, shift, multiplier, shift), as datasketch pre-mixes affine schemes.
_FMIX = {
    "affine32": (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16),
    "affine64": (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33),
}
# Cells of the [num_perm, shingles] permutation matrix computed at once: bounds worker memory
# (4-8 MB) and keeps it near the CPU caches; measured fastest among 2^18..2^22.
_CHUNK_CELLS = 1 << 20
# (false positive, false negative) weights for datasketch's choice of banding. Every candidate
# is verified against the threshold, so a spurious candidate costs one vector comparison while a
# missed one is a duplicate kept: lean to recall. At threshold 0.8 and 128 permutations this gives
# 14 bands x 9 rows, catching 99.9% of pairs at J=0.9 (the even (0.5, 0.5) gives 9 x 13 and 93%).
_LSH_WEIGHTS = (0.1, 0.9)
# Below this many documents, auto (workers=0) stays in one process: spawning a worker costs
# 2-5 s of imports (prefect, datasketch/scipy), about what it would save on ~16k documents.
_AUTO_PARALLEL_MIN_DOCS = 16384


class NearDedupConfig(StrictModel):
    num_perm: int = Field(128, ge=2, le=4096)  # MinHashLSH needs at least 2 permutations
    ngram: int = Field(5, ge=1)  # words per shingle; shorter documents are one shingle
    threshold: float = Field(0.8, gt=0.0, lt=1.0)  # estimated Jaccard at or above which a document is a duplicate
    bands: int | None = Field(None, ge=2)  # explicit LSH banding; None = chosen from the threshold (make_lsh)
    rows: int | None = Field(None, ge=1)
    seed: int = Field(1, ge=0, lt=2**32)  # permutation seed (numpy RandomState range)
    scheme: Scheme = "affine32"  # datasketch permutation scheme the signatures match
    workers: int = Field(0, ge=0)  # signature processes; 0 = all usable cores for large inputs (see plan_workers)
    batch_size: int = Field(2048, ge=1)  # documents per signature job and per Parquet read

    @model_validator(mode="after")
    def _check_banding(self) -> "NearDedupConfig":
        if (self.bands is None) != (self.rows is None):
            raise ValueError(
                f"bands={self.bands} and rows={self.rows}: give both (explicit LSH banding) or neither "
                "(banding chosen from the threshold)"
            )
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"bands * rows = {self.bands} * {self.rows} = {self.bands * self.rows} exceeds num_perm={self.num_perm}; "
                "lower bands or rows, or raise num_perm"
            )
        return self


def shingles(text: str, n: int) -> list[str]:
    """Word n-grams of `text` (split on whitespace, joined by one space); a text of
    fewer than n words is one shingle, a text with no words has none."""
    words = text.split()
    if len(words) <= n:
        return [" ".join(words)] if words else []
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def permutations(cfg: NearDedupConfig) -> np.ndarray:
    """The (a, b) permutation parameters, shape [2, num_perm], exactly as datasketch draws them."""
    return np.asarray(MinHash(cfg.num_perm, seed=cfg.seed, scheme=cfg.scheme).permutations, dtype=_DTYPE[cfg.scheme])


def _hash_shingles(texts: Sequence[str], ngram: int, scheme: Scheme) -> tuple[np.ndarray, np.ndarray]:
    """First 4 (8 for affine64) little-endian bytes of SHA-1 of each shingle of each text's
    dedup key, as datasketch's sha1_hash32/64, and the number of shingles per text."""
    sha1 = hashlib.sha1
    digests: list[bytes] = []
    counts = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        grams = shingles(dedup_key(text), ngram)
        counts[i] = len(grams)
        digests.extend([sha1(g.encode("utf-8")).digest() for g in grams])
    width = 8 if scheme == "affine64" else 4
    raw = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 20)[:, :width]
    hashes = np.ascontiguousarray(raw).view("<u8" if width == 8 else "<u4").ravel()
    return hashes.astype(_DTYPE[scheme], copy=False), counts


def _fmix(h: np.ndarray, scheme: Scheme) -> np.ndarray:
    s1, m1, s2, m2, s3 = (_DTYPE[scheme](c) for c in _FMIX[scheme])
    h = h ^ (h >> s1)
    h = h * m1
    h = h ^ (h >> s2)
    h = h * m2
    return h ^ (h >> s3)


def _signature_job(
    texts: Sequence[str] | pa.Array, ngram: int, perms: np.ndarray, scheme: Scheme
) -> tuple[np.ndarray, np.ndarray, float]:
    """Signatures [len(texts), num_perm] of one batch, shingles per text, and the CPU seconds it took."""
    start = time.process_time()
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = texts.to_pylist()
    hashes, counts = _hash_shingles(texts, ngram, scheme)
    num_perm = perms.shape[1]
    a, b = perms[0][:, None], perms[1][:, None]
    # Transposed [num_perm, shingles] layout: reduceat then runs along contiguous rows,
    # about 4x faster than reducing over axis 0 of [shingles, num_perm].
    out = np.full((num_perm, len(texts)), _MAX_HASH[scheme], dtype=_DTYPE[scheme])
    if scheme != "legacy":
        hashes = _fmix(hashes, scheme)
    doc_of = np.repeat(np.arange(len(texts)), counts)
    step = max(1, _CHUNK_CELLS // num_perm)
    # Chunks of shingles may split a document; np.minimum into `out` merges the parts.
    with np.errstate(over="ignore"):
        for s0 in range(0, len(hashes), step):
            h = hashes[None, s0 : s0 + step]
            docs = doc_of[s0 : s0 + step]
            phv = a * h
            phv += b  # uint arithmetic wraps mod 2^width: for affine schemes that is the permutation
            if scheme == "legacy":
                # datasketch's uint64 products also wrap mod 2^64 before the prime modulus.
                phv %= _MERSENNE_PRIME
                phv &= _MAX_HASH["legacy"]
            starts = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
            seg_docs = docs[starts]
            out[:, seg_docs] = np.minimum(out[:, seg_docs], np.minimum.reduceat(phv, starts, axis=1))
    out = np.ascontiguousarray(out.T)
    return out, counts, time.process_time() - start


def plan_workers(cfg: NearDedupConfig, n_docs: int) -> int:
    """Signature processes for `n_docs` documents; 1 means in this process.

    An explicit `workers` is used whenever there is more than one batch. With
    workers=0 (auto) every usable core is used, but only from _AUTO_PARALLEL_MIN_DOCS
    documents: a spawned worker first spends seconds importing this module."""
    return parallel.plan_workers(n_docs, cfg.batch_size, cfg.workers, parallel_from=_AUTO_PARALLEL_MIN_DOCS)


def _signature_jobs(tagged_texts: Iterable[tuple[T, Sequence[str] | pa.Array]], cfg: NearDedupConfig) -> Iterator[tuple[T, tuple]]:
    perms = permutations(cfg)
    for tag, texts in tagged_texts:
        yield tag, (texts, cfg.ngram, perms, cfg.scheme)


def compute_signatures(texts: list[str], cfg: NearDedupConfig) -> np.ndarray:
    """MinHash signatures of `texts`, shape [n, num_perm], dtype as datasketch stores the
    scheme (uint32 for affine32, uint64 otherwise); a text with no words gets the empty
    sketch (all maximum hash). Uses `cfg.workers` processes for more than one batch."""
    batches = ((None, texts[i : i + cfg.batch_size]) for i in range(0, len(texts), cfg.batch_size))
    jobs = _signature_jobs(batches, cfg)
    parts = [sigs for _, (sigs, _, _) in parallel.ordered_map(_signature_job, jobs, plan_workers(cfg, len(texts)))]
    if not parts:
        return np.empty((0, cfg.num_perm), dtype=_DTYPE[cfg.scheme])
    return np.concatenate(parts)


def make_lsh(cfg: NearDedupConfig) -> MinHashLSH:
    """An in-memory LSH index with the configured banding, or datasketch's optimum for the
    threshold under recall-leaning weights (_LSH_WEIGHTS)."""
    params = (cfg.bands, cfg.rows) if cfg.bands is not None else None
    return MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm, params=params, weights=_LSH_WEIGHTS)


class _KeptIndex:
    """Kept documents: LSH index keyed by kept ordinal, their signatures and doc ids."""

    def __init__(self, cfg: NearDedupConfig):
        self.cfg = cfg
        self.lsh = make_lsh(cfg)
        self.sigs = np.empty((1024, cfg.num_perm), dtype=_DTYPE[cfg.scheme])
        self.ids: list[str] = []

    def best_match(self, sketch: LeanMinHash) -> tuple[int, float] | None:
        """The kept document most similar to `sketch` among LSH candidates (earliest on ties)."""
        found = self.lsh.query(sketch)
        if not found:
            return None
        keys = np.sort(np.fromiter(found, dtype=np.int64, count=len(found)))
        sims = np.count_nonzero(self.sigs[keys] == sketch.hashvalues, axis=1) / self.cfg.num_perm
        best = int(np.argmax(sims))
        return int(keys[best]), float(sims[best])

    def add(self, doc_id: str, sketch: LeanMinHash) -> None:
        key = len(self.ids)
        if key == len(self.sigs):
            self.sigs = np.concatenate([self.sigs, np.empty_like(self.sigs)])
        self.sigs[key] = sketch.hashvalues
        self.ids.append(doc_id)
        self.lsh.insert(key, sketch, check_duplication=False)


@dataclass
class _Tally:
    """What near dedup measures besides the counts: removals, similarities, seconds."""

    dup_targets: set[str] = field(default_factory=set)
    similarities: list[float] = field(default_factory=list)
    unindexed: int = 0
    sig_seconds: float = 0.0
    lsh_seconds: float = 0.0
    lsh_cpu: float = 0.0


def near_dedup(in_path: Path, out_path: Path, removed_path: Path, cfg: NearDedupConfig) -> StageResult:
    """Remove near-duplicate documents of `in_path` (see module docstring); write kept and removed files."""
    in_path = Path(in_path)
    if not in_path.is_file():
        raise FileNotFoundError(f"near_dedup: input {in_path} does not exist; run the exact_dedup stage first")
    total_rows = pq.ParquetFile(in_path).metadata.num_rows
    workers = plan_workers(cfg, total_rows)
    index = _KeptIndex(cfg)
    tally = _Tally()
    tables = (as_documents(b) for b in iter_batches(in_path, batch_size=cfg.batch_size))
    jobs = _signature_jobs(((t, t.column("text")) for t in tables), cfg)
    with DataStep(STAGE, out_path, removed_path) as step, tqdm(total=total_rows, unit="doc", desc=STAGE, disable=None) as progress:
        for table, (sigs, n_shingles, secs) in parallel.ordered_map(_signature_job, jobs, workers):
            tally.sig_seconds += secs
            _dedup_batch(step, table, sigs, n_shingles, index, tally)
            progress.update(table.num_rows)
    return step.result(_stats(tally, index, workers, step.elapsed), duplicate_reason=REASON)


def _dedup_batch(
    step: DataStep, table: pa.Table, sigs: np.ndarray, n_shingles: np.ndarray, index: _KeptIndex, tally: _Tally
) -> None:
    """Keep or remove each document of one batch, in order, against the kept index."""
    cfg = index.cfg
    t0, c0 = time.perf_counter(), time.thread_time()
    keep_rows: list[int] = []
    drop_rows: list[int] = []
    dup_of: list[str] = []
    sims: list[float] = []
    for i, doc_id in enumerate(table.column("doc_id").to_pylist()):
        if n_shingles[i] == 0:
            tally.unindexed += 1
            keep_rows.append(i)
            continue
        sketch = LeanMinHash(seed=cfg.seed, hashvalues=sigs[i], scheme=cfg.scheme)
        match = index.best_match(sketch)
        if match is not None and match[1] >= cfg.threshold:
            drop_rows.append(i)
            dup_of.append(index.ids[match[0]])
            sims.append(match[1])
        else:
            keep_rows.append(i)
            index.add(doc_id, sketch)
    tally.lsh_seconds += time.perf_counter() - t0
    tally.lsh_cpu += time.thread_time() - c0
    if keep_rows:
        step.keep(table.take(pa.array(keep_rows, pa.int64())))
    if drop_rows:
        gone = table.take(pa.array(drop_rows, pa.int64()))
        step.remove(removed_from_documents(gone, STAGE, [REASON] * len(drop_rows), duplicate_of=dup_of, similarity=sims))
        tally.dup_targets.update(dup_of)
        tally.similarities.extend(sims)
    step.read(table)


def _stats(tally: _Tally, index: _KeptIndex, workers: int, seconds: float) -> dict[str, float | int]:
    return {
        "clusters_with_removals": len(tally.dup_targets),
        "mean_similarity_removed": round(float(np.mean(tally.similarities)), 6) if tally.similarities else 0.0,
        # CPU seconds stay comparable on a busy machine; these are summed over worker processes.
        "cpu_seconds_signatures": round(tally.sig_seconds, 3),
        "seconds_lsh": round(tally.lsh_seconds, 3),  # wall seconds of query + insert, in this process
        "cpu_seconds_lsh": round(tally.lsh_cpu, 3),
        "seconds_total": round(seconds, 3),
        "lsh_bands": index.lsh.b,
        "lsh_rows": index.lsh.r,
        "workers": workers,
        "unindexed_empty": tally.unindexed,
    }


near_dedup_task = task(near_dedup, name="near_dedup")
