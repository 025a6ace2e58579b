"""The mix's plan for sizes held in memory: what rebalance_mix decides over streamed batches, in one call."""
from __future__ import annotations

import numpy as np

from tasks.data.mix import HASH_BUCKETS, hash_buckets, plan_cuts


def plan_mix(sizes_by_source: dict[str, np.ndarray], weights: dict[str, float], max_epochs: dict[str, float], seed: int,
             total: int | None = None, doc_ids: dict[str, list[str]] | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Repeat counts per document of each source, and a report of target vs achieved shares; the same method as
    `rebalance_mix`. Documents are hashed by `doc_ids`, else by index."""
    buckets = {
        s: hash_buckets(seed, s, doc_ids[s] if doc_ids else [str(i) for i in range(len(v))])
        for s, v in sizes_by_source.items()
    }
    hists = {s: np.bincount(buckets[s], weights=v, minlength=HASH_BUCKETS).astype(np.int64)
             for s, v in sizes_by_source.items()}
    plan, report = plan_cuts(hists, weights, max_epochs, total)
    repeats = {s: plan[s][0] + (buckets[s] < plan[s][1]).astype(np.int64) for s in sizes_by_source}
    return repeats, report
