"""verify="estimate" of near dedup (tasks/data/near_dedup.py): the MinHash estimate, checked
where it cannot be trusted.

The share of equal signature values estimates the Jaccard of the documents' sets of 32-bit
shingle hashes, and two distinct shingles share a 32-bit hash with chance 2^-32: among a
million distinct one-word documents ~100 pairs collide, each a candidate whose signatures
are equal, estimate 1.0. So, besides its signature, pass 1 keeps per document:
- the size of its set of distinct 64-bit shingle hashes and a 64-bit digest of that set
  (minhash_signatures.distinct_sets), in `meta_columns` extra columns of its signature row
  (read with it, no second read per row);
- the set itself, in the shingle set file, for a document of at most `spill_limit` distinct
  shingles (8 bytes each; none for a longer one).

Pass 3 then decides a candidate pair by
- the exact Jaccard of the two 64-bit sets when both were kept (`verified_exact`): every pair
  with a short document (at most num_perm / 4 distinct shingles) whose Jaccard could reach the
  threshold is one, as the limit is chosen so that a short document and a longer one are
  provably apart (J <= |A| / |B|);
- otherwise min(estimate, bound): J <= min(|A|, |B|) / max(|A|, |B|), and two sets of one size
  that differ (different digests) have J <= (|A| - 1) / (|A| + 1). A similarity of 1.0 is
  then only ever given to identical sets; `estimate_capped` counts the pairs the bound lowered.

Short is num_perm / 4: one collision changes the hashed Jaccard of sets of k shingles by about
(1 + J)^2 / 2k, more than the 128-permutation estimate's own deviation (~0.035 near 0.8) up to
k ~ 45, and a set of num_perm / 4 shingles costs half of its signature row (2 vs 4 bytes per
permutation). The sets kept reach num_perm / (4 * threshold) shingles (40 at 128 and 0.8).
"""
from __future__ import annotations

import math

import numpy as np

from tasks.data.lsh_buckets import ShingleSetFile, SignatureFile


def spill_limit(num_perm: int, threshold: float) -> tuple[int, int]:
    """(short, limit): documents of at most `short` distinct shingles are verified exactly, so
    the sets of those of at most `limit` are kept, the fewest with short / (limit + 1) < threshold:
    a short document can only reach the threshold with one of at most `limit` shingles."""
    short = max(1, num_perm // 4)
    limit = max(short, math.floor(short / threshold))
    while short / (limit + 1) >= threshold:  # float rounding of the floor
        limit += 1
    return short, min(limit, 2**32 - 1)  # sizes are uint32; a lower threshold keeps every set


def meta_dtype(sig_dtype: np.dtype) -> np.dtype:
    """A document's set digest and size, as appended to its signature row (whole signature values)."""
    return np.dtype([("digest", "<u8"), ("count", np.dtype(sig_dtype).newbyteorder("<"))])


def meta_columns(sig_dtype: np.dtype) -> int:
    return meta_dtype(sig_dtype).itemsize // np.dtype(sig_dtype).itemsize


def with_meta(sigs: np.ndarray, distinct: np.ndarray, digests: np.ndarray) -> np.ndarray:
    """Signature rows [n, num_perm] with each document's digest and distinct shingle count appended."""
    meta = np.empty(len(sigs), dtype=meta_dtype(sigs.dtype))
    meta["digest"], meta["count"] = digests, distinct
    return np.concatenate([sigs, meta.view(sigs.dtype).reshape(len(sigs), -1)], axis=1)


def _meta(rows: np.ndarray, num_perm: int) -> np.ndarray:
    return np.ascontiguousarray(rows[:, num_perm:]).view(meta_dtype(rows.dtype)).ravel()


def size_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The largest Jaccard two sets with these (digest, count) metas can have."""
    ca, cb = a["count"].astype(np.int64), b["count"].astype(np.int64)
    bound = np.minimum(ca, cb) / np.maximum(ca, cb)
    differ = (ca == cb) & (a["digest"] != b["digest"])
    bound[differ] = (ca[differ] - 1) / (ca[differ] + 1)
    return bound


def estimated_similarity(
    rec: np.ndarray, later_rows: np.ndarray, lo: int, rows_file: SignatureFile, sets: ShingleSetFile, num_perm: int,
    threshold: float, tally,
) -> np.ndarray:
    """Similarity of each candidate pair of `rec` (earlier, later; later documents lo.. in
    `later_rows`): exact where both sets were kept, else min(estimate, size_bound). Adds to
    `tally`'s verified_exact and estimate_capped."""
    earlier = rec["earlier"].astype(np.int64)
    uniq, inverse = np.unique(earlier, return_inverse=True)
    inside = uniq >= lo  # earlier documents of this block are already in memory
    earlier_rows = np.empty((len(uniq), later_rows.shape[1]), dtype=later_rows.dtype)
    earlier_rows[inside] = later_rows[uniq[inside] - lo]
    earlier_rows[~inside] = rows_file.read_rows(uniq[~inside])
    a_rows, b_rows = earlier_rows[inverse], later_rows[rec["later"].astype(np.int64) - lo]
    sim = np.count_nonzero(a_rows[:, :num_perm] == b_rows[:, :num_perm], axis=1) / num_perm
    a, b = _meta(a_rows, num_perm), _meta(b_rows, num_perm)
    limit = spill_limit(num_perm, threshold)[1]
    kept = (a["count"] <= limit) & (b["count"] <= limit)
    bound = size_bound(a, b)
    tally.estimate_capped += int(np.count_nonzero((bound < sim) & ~kept))
    np.minimum(sim, bound, out=sim)
    if kept.any():
        sim[kept] = sets.jaccard(rec["earlier"][kept], rec["later"][kept])
        tally.verified_exact += int(np.count_nonzero(kept))
    return sim
