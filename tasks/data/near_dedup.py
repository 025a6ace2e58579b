"""Near-duplicate removal with MinHash signatures and LSH banding, out of core.

Signatures (tasks/data/minhash_signatures.py) are word n-gram MinHashes of each text's
dedup key, computed batch-wise in the data stages' one process pool
(tasks/data/parallel.py, whose spawned workers need the usual
`if __name__ == "__main__":` guard in a script).

Keep rule (deterministic): documents are visited in input order; a document is
removed as "near_duplicate" when an already-kept LSH candidate has Jaccard >= threshold
(`duplicate_of` = the most similar one, earliest on ties; `similarity` = that Jaccard),
otherwise it is kept. Documents with no words are kept and never indexed: the Jaccard
similarity of empty sets is undefined, and exact dedup has already dropped empty texts.

Verification (`verify`): LSH banding only proposes candidates; each candidate pair's Jaccard
is then checked against the threshold.
- "exact" (default): |A∩B| / |A∪B| of the two documents' sets of 64-bit shingle hashes (the
  shingles the signatures are built from): distinct shingles collide with chance 2^-64 (with
  32 bits, ~100 pairs of a million one-word texts would collide and read as identical). The
  128-permutation estimate has standard deviation sqrt(J(1-J)/128), about 0.03 near J = 0.8: a pair at J = 0.85 fails
  an estimated check ~6% of the time and one in [0.8, 0.9) ~15% on average, while pairs below the threshold pass it.
  Exact verification leaves LSH banding (tuned for recall, _LSH_WEIGHTS) as the only source of misses and removes
  nothing below the threshold. Cost: each document's sorted distinct shingle hashes on disk (8 bytes per shingle + 8
  per document, in place of the signatures' 4 * num_perm bytes) and a merge per candidate pair.
- "estimate": the share of equal signature values (the MinHash estimate), as datasketch's
  MinHashLSH users compare, checked where it fails (tasks/data/minhash_estimate.py): a pair
  with a short document is verified exactly (32-bit hash collisions would make distinct
  one-word texts identical), and a similarity of 1.0 always means identical sets.

Memory does not grow with the corpus (besides one byte per document and the ids of the
documents that others duplicate): everything else is spilled to a folder next to the
output (tasks/data/lsh_buckets.py) and read back in bounded pieces, in four passes:
1. signatures: stream the input, append each document's shingle set (exact; estimate: its
   signature, set size and digest, a short one's set) to files and (band hash, document)
   records to partition files by hash;
2. candidates: per partition, sort the records and write the (earlier, later) pairs of
   documents sharing a bucket, into files by the later document's block of rows;
3. keep rule: per block in input order, verify each pair's Jaccard (exact from the two
   shingle sets, or estimated and checked as above) and visit the later documents in
   order with a kept flag per document: a document is removed iff a verified earlier
   document is kept. This is the greedy rule over an index of kept documents, exactly, as
   long as every same-bucket pair is a candidate: a bucket member is only paired with the
   `bucket_cap` earliest members before it (stats `bucket_cap_hits` counts how often that
   cut pairs);
4. output: stream the input once more, writing kept and removed documents (DataStep).
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch.lsh import _optimal_param
from pydantic import Field, model_validator
from tqdm.auto import tqdm

from infra.config import StrictModel
from infra.stages import Stage
from tasks.data import parallel
from tasks.data.documents import as_documents, iter_batches, removed_from_documents
from tasks.data.lsh_buckets import (BandSpill, PairSpill, ShingleSetFile, SignatureFile, band_hashes, candidate_pairs,
                                    read_pair_chunks, resolve_block)
from tasks.data.minhash_estimate import estimated_similarity, meta_columns, spill_limit, with_meta
from tasks.data.minhash_signatures import DTYPE, Scheme, permutations, shingles, signature_job
from tasks.data.step import DataStep, StageResult

__all__ = ["NearDedupConfig", "compute_signatures", "near_dedup", "NearDedup", "plan_workers", "shingles", "banding"]

T = TypeVar("T")

STAGE = "near_dedup"
REASON = "near_duplicate"

# (false positive, false negative) weights for datasketch's choice of banding. Every candidate
# is verified against the threshold, so a spurious candidate costs one vector comparison while a
# missed one is a duplicate kept: lean to recall. At threshold 0.8 and 128 permutations this gives
# 14 bands x 9 rows, catching 99.9% of pairs at J=0.9 (the even (0.5, 0.5) gives 9 x 13 and 93%).
_LSH_WEIGHTS = (0.1, 0.9)
# Band records per partition file (12 bytes each): a partition is loaded and sorted whole.
_PARTITION_RECORDS = 1 << 20
# Bytes of later documents' signatures read at once in pass 3.
_BLOCK_BYTES = 8 << 20


class NearDedupConfig(StrictModel):
    enabled: bool = True  # False: the data flow leaves the stage out (an ablation's "near dedup off")
    num_perm: int = Field(128, ge=2, le=4096)  # LSH banding needs at least 2 permutations
    ngram: int = Field(5, ge=1)  # words per shingle; shorter documents are one shingle
    threshold: float = Field(0.8, gt=0.0, lt=1.0)  # Jaccard at or above which a document is a duplicate
    # How a candidate pair's Jaccard is checked against the threshold: "exact" over the two documents'
    # sets of shingle hashes (spilled in pass 1), "estimate" from their signatures (module docstring).
    verify: Literal["exact", "estimate"] = "exact"
    bands: int | None = Field(None, ge=2)  # explicit LSH banding; None = chosen from the threshold (banding)
    rows: int | None = Field(None, ge=1)
    seed: int = Field(1, ge=0, lt=2**32)  # permutation and word-hash seed
    # xxh3: fast (see minhash_signatures); affine32/affine64/legacy: bit-identical to datasketch's schemes
    scheme: Scheme = "xxh3"
    workers: int = Field(0, ge=0)  # signature processes; 0 = chosen from measured cost (tasks/data/parallel.py)
    batch_size: int = Field(2048, ge=1)  # documents per signature job and per Parquet read
    # Each member of an LSH bucket is compared with at most this many earliest members before it:
    # bounds a bucket of k documents to k * bucket_cap pairs instead of k^2 / 2.
    bucket_cap: int = Field(256, ge=1)

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


def banding(cfg: NearDedupConfig) -> tuple[int, int]:
    """(bands, rows): the configured ones, or datasketch's optimum for the threshold under
    recall-leaning weights (_LSH_WEIGHTS)."""
    if cfg.bands is not None:
        return cfg.bands, cfg.rows
    b, r = _optimal_param(cfg.threshold, cfg.num_perm, *_LSH_WEIGHTS)
    return int(b), int(r)


def plan_workers(cfg: NearDedupConfig, n_docs: int) -> int:
    """The `workers` argument of the signature map for `n_docs` documents (parallel.plan_workers):
    1 = this process, 0 = chosen from measured cost."""
    return parallel.plan_workers(n_docs, cfg.batch_size, cfg.workers)


def _n_jobs(cfg: NearDedupConfig, n_docs: int) -> int:
    return -(-n_docs // cfg.batch_size)


def _signature_jobs(
    tagged_texts: Iterable[tuple[T, Sequence[str] | pa.Array]], cfg: NearDedupConfig, sets: bool = False,
    short: int | None = None,
) -> Iterator[tuple[T, tuple]]:
    perms = permutations(cfg.num_perm, cfg.seed, cfg.scheme)
    for tag, texts in tagged_texts:
        yield tag, (texts, cfg.ngram, perms, cfg.scheme, cfg.seed, sets, short)


def compute_signatures(texts: list[str], cfg: NearDedupConfig) -> np.ndarray:
    """MinHash signatures of `texts`, shape [n, num_perm] (uint32 for xxh3 and affine32,
    uint64 otherwise, as datasketch stores its schemes); a text with no words gets the
    empty sketch (all maximum hash). Uses `cfg.workers` processes for more than one batch."""
    batches = ((None, texts[i : i + cfg.batch_size]) for i in range(0, len(texts), cfg.batch_size))
    jobs = _signature_jobs(batches, cfg)
    mapped = parallel.ordered_map(signature_job, jobs, plan_workers(cfg, len(texts)), n_jobs=_n_jobs(cfg, len(texts)),
                                  label="minhash signatures")
    parts = [sigs for _, (sigs, _, _, _) in mapped]
    if not parts:
        return np.empty((0, cfg.num_perm), dtype=DTYPE[cfg.scheme])
    return np.concatenate(parts)


@dataclass
class _Tally:
    """What near dedup measures besides the counts."""

    unindexed: int = 0
    sig_seconds: float = 0.0
    lsh_seconds: float = 0.0
    lsh_cpu: float = 0.0
    band_records: int = 0
    candidate_pairs: int = 0
    verified_pairs: int = 0
    verified_exact: int = 0
    estimate_capped: int = 0
    short_sets: int = 0
    cap_hits: int = 0
    spill_bytes: int = 0
    partitions: int = 0
    clusters: int = 0
    removed: int = 0
    similarity_sum: float = 0.0
    workers: int = 1  # signature workers used (parallel.WorkerPlan)
    worker_plan: str = ""

    def lsh_time(self, wall0: float, cpu0: float) -> None:
        self.lsh_seconds += time.perf_counter() - wall0
        self.lsh_cpu += time.thread_time() - cpu0


DECISION = np.dtype([("doc", "<u4"), ("target", "<u4"), ("similarity", "<f8")])


def near_dedup(in_path: Path, out_path: Path, removed_path: Path, cfg: NearDedupConfig) -> StageResult:
    """Remove near-duplicate documents of `in_path` (see module docstring); write kept and removed files."""
    in_path, out_path = Path(in_path), Path(out_path)
    if not in_path.is_file():
        raise FileNotFoundError(f"near_dedup: input {in_path} does not exist; run the exact_dedup stage first")
    started = time.perf_counter()
    n_docs = pq.ParquetFile(in_path).metadata.num_rows
    if n_docs >= 2**32:
        raise ValueError(f"near_dedup: {in_path} has {n_docs} documents; split it into files under 2^32 documents")
    workers = plan_workers(cfg, n_docs)
    bands, rows = banding(cfg)
    tally = _Tally()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Next to the output: on the same disk as the data, and removed with the folder on failure.
    with tempfile.TemporaryDirectory(prefix=".near-spill-", dir=out_path.parent) as spill_dir:
        spill = Path(spill_dir)
        sigs, sets, indexed = _pass_signatures(in_path, n_docs, cfg, bands, rows, spill, workers, tally)
        decisions = _pass_keep_rule(sigs, sets, indexed, cfg, spill, tally)
        with DataStep(STAGE, out_path, removed_path) as step:
            _pass_output(step, in_path, n_docs, decisions, cfg)
    return step.result(_stats(tally, cfg, bands, rows, time.perf_counter() - started), duplicate_reason=REASON)


def _pass_signatures(
    in_path: Path, n_docs: int, cfg: NearDedupConfig, bands: int, rows: int, spill: Path, workers: int, tally: _Tally
) -> tuple[SignatureFile, ShingleSetFile, np.ndarray]:
    """Pass 1: shingle sets (verify="exact"), or signatures with set sizes and digests and short
    documents' sets (verify="estimate"), band records to partition files; which are indexed."""
    partitions = max(1, min(1024, -(-n_docs * bands // _PARTITION_RECORDS)))
    exact = cfg.verify == "exact"
    dtype = DTYPE[cfg.scheme]
    sigs = SignatureFile(spill / "signatures.bin", cfg.num_perm + (0 if exact else meta_columns(dtype)), dtype)
    sets = ShingleSetFile(spill / "shingle-sets.bin")
    limit = None if exact else spill_limit(cfg.num_perm, cfg.threshold)[1]
    band_spill = BandSpill(spill, partitions)
    indexed = np.zeros(n_docs, dtype=np.bool_)
    texts = (((b.num_rows), b.column("text")) for b in iter_batches(in_path, cfg.batch_size, columns=["text"]))
    start = 0
    with tqdm(total=n_docs, unit="doc", desc=f"{STAGE} 1/4 signatures", disable=None) as progress:
        mapped = parallel.ordered_map(signature_job, _signature_jobs(texts, cfg, exact, limit), workers,
                                      n_jobs=_n_jobs(cfg, n_docs), label=f"{STAGE} signatures")
        for n, (batch_sigs, n_shingles, secs, extra) in mapped:
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            tally.sig_seconds += secs
            if exact:
                sets.append(*extra)  # pass 3 reads these instead of the signatures
            else:
                short_flat, short_counts, distinct, digests = extra
                sets.append(short_flat, short_counts)  # empty for documents over the limit
                sigs.append(with_meta(batch_sigs, distinct, digests))
                tally.short_sets += int(np.count_nonzero(short_counts))
            has = n_shingles > 0
            indexed[start : start + n] = has
            rows_idx = np.flatnonzero(has)
            band_spill.add(band_hashes(batch_sigs[rows_idx], bands, rows), rows_idx + start)
            start += n
            tally.lsh_time(wall0, cpu0)
            progress.update(n)
    tally.workers, tally.worker_plan = mapped.plan.workers, mapped.plan.describe()
    sigs.close_writing()
    sets.close_writing()
    band_spill.close()
    tally.unindexed = int(n_docs - indexed.sum())
    tally.band_records = band_spill.records
    tally.partitions = partitions
    tally.spill_bytes = sigs.rows * sigs.row_bytes + band_spill.files.bytes_written + sets.bytes_written
    return sigs, sets, indexed


def _pass_keep_rule(
    sigs: SignatureFile, sets: ShingleSetFile, indexed: np.ndarray, cfg: NearDedupConfig, spill: Path, tally: _Tally
) -> Path:
    """Passes 2 and 3: candidate pairs by bucket, verified and resolved in input order.
    Returns the file of decisions (removed document, kept target, similarity), in document order."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    n_docs = len(indexed)
    block_rows = max(1, _BLOCK_BYTES // sigs.row_bytes)
    pairs = PairSpill(spill, n_docs, block_rows)
    band_files = sorted(spill.glob("bands-*.bin"))
    for path in tqdm(band_files, unit="partition", desc=f"{STAGE} 2/4 candidates", disable=None):
        for earlier, later, hits in candidate_pairs(path, cfg.bucket_cap):
            tally.cap_hits += hits
            pairs.add(earlier, later)
        path.unlink()
    pair_files = pairs.close()
    tally.candidate_pairs = pairs.pairs
    tally.spill_bytes += pairs.files.bytes_written
    kept = np.ones(n_docs, dtype=np.bool_)
    decisions_path = spill / "decisions.bin"
    targets: set[int] = set()
    with open(decisions_path, "wb") as out:
        for q, path in enumerate(tqdm(pair_files, unit="block", desc=f"{STAGE} 3/4 keep rule", disable=None)):
            lo, hi = q * block_rows, min(n_docs, (q + 1) * block_rows)
            edges = _verified_edges(path, sigs, sets, lo, hi, cfg, tally)
            removed = resolve_block(edges, kept)
            tally.removed += len(removed)
            tally.similarity_sum += float(removed["similarity"].sum())
            targets.update(removed["target"].tolist())
            out.write(removed.tobytes())
            path.unlink()
    tally.clusters = len(targets)
    tally.lsh_time(wall0, cpu0)
    return decisions_path


def _verified_edges(
    path: Path, sigs: SignatureFile, sets: ShingleSetFile, lo: int, hi: int, cfg: NearDedupConfig, tally: _Tally
) -> np.ndarray:
    """Candidate pairs of later documents lo..hi-1 whose Jaccard (exact from the shingle sets, or
    estimated and checked: minhash_estimate) reaches the threshold, sorted by (later, earlier), with it."""
    later_rows = None
    parts = []
    for rec in read_pair_chunks(path):
        if cfg.verify == "exact":
            sim = sets.jaccard(rec["earlier"], rec["later"])
            tally.verified_exact += len(rec)
        else:
            if later_rows is None:
                later_rows = sigs.read_range(lo, hi)
            sim = estimated_similarity(rec, later_rows, lo, sigs, sets, cfg.num_perm, cfg.threshold, tally)
        ok = sim >= cfg.threshold
        edge = np.empty(int(ok.sum()), dtype=DECISION)
        edge["doc"], edge["target"], edge["similarity"] = rec["later"][ok], rec["earlier"][ok], sim[ok]
        parts.append(edge)
    edges = np.concatenate(parts) if parts else np.empty(0, dtype=DECISION)
    tally.verified_pairs += len(edges)
    # Chunks are each sorted by (later, earlier) but may overlap; duplicates are harmless.
    return edges[np.lexsort((edges["target"], edges["doc"]))]


def _pass_output(step: DataStep, in_path: Path, n_docs: int, decisions_path: Path, cfg: NearDedupConfig) -> None:
    """Pass 4: stream the input again, write kept documents and removed ones with their target's id."""
    decisions = np.fromfile(decisions_path, dtype=DECISION)  # one row per removed document
    wanted = np.unique(decisions["target"]).astype(np.int64)
    target_ids: dict[int, str] = {}
    cursor = 0
    start = 0
    with tqdm(total=n_docs, unit="doc", desc=f"{STAGE} 4/4 output", disable=None) as progress:
        for batch in iter_batches(in_path, batch_size=cfg.batch_size):
            table = as_documents(batch)
            n = table.num_rows
            lo, hi = np.searchsorted(wanted, [start, start + n])
            if hi > lo:
                ids = table.column("doc_id").take(pa.array(wanted[lo:hi] - start)).to_pylist()
                target_ids.update(zip(wanted[lo:hi].tolist(), ids))
            end = cursor + int(np.searchsorted(decisions["doc"][cursor:], start + n))
            mine = decisions[cursor:end]
            cursor = end
            drop = mine["doc"].astype(np.int64) - start
            keep_mask = np.ones(n, dtype=np.bool_)
            keep_mask[drop] = False
            if keep_mask.any():
                step.keep(table.filter(pa.array(keep_mask)))
            if len(drop):
                step.remove(
                    removed_from_documents(
                        table.take(pa.array(drop)), STAGE, [REASON] * len(drop),
                        duplicate_of=[target_ids[t] for t in mine["target"].tolist()],
                        similarity=mine["similarity"].tolist(),
                    )
                )
            step.read(table)
            start += n
            progress.update(n)


def _stats(tally: _Tally, cfg: NearDedupConfig, bands: int, rows: int, seconds: float) -> dict[str, float | int | str]:
    return {
        "clusters_with_removals": tally.clusters,
        "mean_similarity_removed": round(tally.similarity_sum / tally.removed, 6) if tally.removed else 0.0,
        # CPU seconds stay comparable on a busy machine; these are summed over worker processes.
        "cpu_seconds_signatures": round(tally.sig_seconds, 3),
        "seconds_lsh": round(tally.lsh_seconds, 3),  # wall seconds of banding, candidates and keep rule, in this process
        "cpu_seconds_lsh": round(tally.lsh_cpu, 3),
        "seconds_total": round(seconds, 3),
        "lsh_bands": bands,
        "lsh_rows": rows,
        "workers": tally.workers,
        "worker_plan": tally.worker_plan,
        "unindexed_empty": tally.unindexed,
        "band_records": tally.band_records,
        "candidate_pairs": tally.candidate_pairs,
        "verify": cfg.verify,
        "verified_exact": tally.verified_exact,  # candidate pairs whose exact Jaccard was computed
        # verify="estimate": documents whose set was kept for exact checks, pairs whose estimate a size bound lowered
        "estimate_short_sets": tally.short_sets,
        "estimate_capped": tally.estimate_capped,
        "verified_pairs": tally.verified_pairs,  # candidate pairs at or above the threshold
        "bucket_cap_hits": tally.cap_hits,  # bucket members whose comparisons bucket_cap cut short
        "spill_partitions": tally.partitions,
        "spill_bytes": tally.spill_bytes,
    }


class NearDedup(Stage):
    """Near duplicates (MinHash + LSH) out: work/data/near/<key>/{docs,removed}.parquet."""

    name, store, Config, Result = STAGE, "data/near", NearDedupConfig, StageResult
    inputs = ("docs",)

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return near_dedup(inputs["docs"], out_dir / "docs.parquet", out_dir / "removed.parquet", self.config)
