"""The out-of-core near dedup reproduces the in-memory greedy rule (datasketch MinHashLSH over
kept documents, as the stage used to run, verifying candidates by exact or checked estimated Jaccard)
exactly: same kept set, duplicate_of and similarity, on planted clusters and chains (A~B, B~C,
A!~C: B goes, C stays); its spill folder is removed."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasketch import LeanMinHash, MinHashLSH

from tasks.data.documents import Document, documents_table
from tasks.data.minhash_estimate import spill_limit
from tasks.data.minhash_signatures import shingles
from tasks.data.near_dedup import NearDedupConfig, banding, compute_signatures, near_dedup
from tasks.data.text_normalize import dedup_key
from tests.helpers.near_dedup import make_variant
from tests.helpers.parquet import write_table_atomic


def grams(text: str, n: int) -> set[tuple[str, ...]]:
    words = dedup_key(text).split()
    return {tuple(words)} if len(words) <= n else {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def exact_jaccard(a: str, b: str, n: int) -> float:
    """Jaccard of the two texts' sets of word n-grams (Python tuples, no hashing)."""
    sa, sb = grams(a, n), grams(b, n)
    return len(sa & sb) / len(sa | sb)


def checked_estimate(a: str, b: str, estimate: float, cfg: NearDedupConfig) -> float:
    """verify="estimate": the exact Jaccard when both sets are within spill_limit, else the
    estimate lowered to the largest Jaccard the two sets' sizes (and whether they are equal) allow."""
    sa, sb = grams(a, cfg.ngram), grams(b, cfg.ngram)
    limit = spill_limit(cfg.num_perm, cfg.threshold)[1]
    if len(sa) <= limit and len(sb) <= limit:
        return len(sa & sb) / len(sa | sb)
    if sa == sb:
        return estimate
    bound = (len(sa) - 1) / (len(sa) + 1) if len(sa) == len(sb) else min(len(sa), len(sb)) / max(len(sa), len(sb))
    return min(estimate, bound)


def reference_near_dedup(texts: list[str], cfg: NearDedupConfig) -> dict[int, tuple[int, float]]:
    """The greedy rule in memory: {removed index: (kept target index, similarity)}; candidates
    are verified by `cfg.verify` (exact: Jaccard of Python sets of n-gram tuples)."""
    sigs = compute_signatures(texts, cfg.model_copy(update={"workers": 1}))
    scheme = "affine64" if sigs.dtype == np.uint64 else "affine32"  # datasketch's LSH only reads hashvalues
    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm, params=banding(cfg))
    removed: dict[int, tuple[int, float]] = {}
    for i, text in enumerate(texts):
        if not shingles(dedup_key(text), cfg.ngram):
            continue
        sketch = LeanMinHash(seed=cfg.seed, hashvalues=sigs[i], scheme=scheme)
        keys = sorted(lsh.query(sketch))
        if keys:
            if cfg.verify == "exact":
                sims = np.array([exact_jaccard(texts[k], text, cfg.ngram) for k in keys])
            else:
                estimates = np.count_nonzero(sigs[keys] == sigs[i], axis=1) / cfg.num_perm
                sims = np.array([checked_estimate(texts[k], text, e, cfg) for k, e in zip(keys, estimates)])
            best = int(np.argmax(sims))
            if sims[best] >= cfg.threshold:
                removed[i] = (keys[best], float(sims[best]))
                continue
        lsh.insert(i, sketch, check_duplication=False)
    return removed


def planted_corpus(n_groups: int, seed: int) -> list[str]:
    """Unrelated documents, near-copy clusters of several sizes and chains A~B~C, short near
    copies, shuffled so that clusters interleave; a few empty and short texts."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(5000)]
    docs: list[str] = []
    for g in range(n_groups):
        base = [rng.choice(vocab) for _ in range(rng.randint(60, 200))]
        kind = g % 4
        if kind == 0:
            docs.append(" ".join(base))
        elif kind == 1:  # cluster: copies with 0..12 edits
            docs += [" ".join(make_variant(base, rng.randint(0, 12), vocab, rng)) for _ in range(rng.randint(2, 6))]
        else:  # chain: each link a few edits from the previous one
            link = base
            for _ in range(rng.randint(3, 5)):
                docs.append(" ".join(link))
                link = make_variant(link, rng.randint(2, 6), vocab, rng)
    for _ in range(n_groups // 20):  # short near copies (5 to 40 shingles): "estimate" checks them exactly
        base = [rng.choice(vocab) for _ in range(rng.randint(9, 44))]
        docs += [" ".join(make_variant(base, rng.randint(0, 3), vocab, rng)) for _ in range(rng.randint(2, 4))]
    rng.shuffle(docs)
    docs[5:5] = ["", "   ", "one", "two words", "a b c d"]
    return docs


def run_stage(texts: list[str], cfg: NearDedupConfig, tmp: Path) -> tuple[list[str], dict[str, tuple[str, float]], dict]:
    docs = [Document(f"d{i}", "web" if i % 3 else "code", t) for i, t in enumerate(texts)]
    path = write_table_atomic(documents_table(docs), tmp / "in.parquet")
    result = near_dedup(path, tmp / "out" / "kept.parquet", tmp / "out" / "removed.parquet", cfg)
    kept = pq.read_table(tmp / "out" / "kept.parquet").column("doc_id").to_pylist()
    removed = {r["doc_id"]: (r["duplicate_of"], r["similarity"]) for r in pq.read_table(tmp / "out" / "removed.parquet").to_pylist()}
    assert not list((tmp / "out").glob(".near-spill-*")), "spill folder left behind"
    return kept, removed, result.stats


@pytest.mark.parametrize("scheme, verify", [("xxh3", "exact"), ("xxh3", "estimate"), ("affine32", "estimate"),
                                           ("affine64", "exact")])
def test_same_decisions_as_in_memory_greedy_rule(tmp_path, scheme, verify):
    texts = planted_corpus(900, seed=3)
    cfg = NearDedupConfig(workers=1, batch_size=333, scheme=scheme, threshold=0.7, verify=verify)
    ref = reference_near_dedup(texts, cfg)
    kept, removed, stats = run_stage(texts, cfg, tmp_path)
    assert len(texts) > 2000 and len(ref) > 500, "the corpus no longer plants enough near copies"
    assert kept == [f"d{i}" for i in range(len(texts)) if i not in ref]
    assert removed == {f"d{i}": (f"d{t}", s) for i, (t, s) in ref.items()}
    assert stats["bucket_cap_hits"] == 0
    assert stats["clusters_with_removals"] == len({t for t, _ in ref.values()})
    # A target is always a kept document, never one removed before.
    assert not {t for t, _ in ref.values()} & set(ref), "a removed document was chosen as a target"
    # Chains were planted: some kept documents have a verified near copy that was removed (the
    # chain's middle), which is what a transitive (union-find) rule would have removed too.
    assert stats["verified_pairs"] > len(ref)


@pytest.mark.parametrize("verify", ["exact", "estimate"])
def test_chain_a_b_c_keeps_c(tmp_path, verify):
    rng = random.Random(5)
    vocab = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(3000)]
    a = [rng.choice(vocab) for _ in range(200)]
    b = make_variant(a, 4, vocab, rng)
    c = make_variant(b, 4, vocab, rng)
    texts = [" ".join(a), " ".join(b), " ".join(c)]
    cfg = NearDedupConfig(workers=1, threshold=0.75, verify=verify)
    sigs = compute_signatures(texts, cfg)
    if verify == "exact":
        sim = lambda x, y: exact_jaccard(texts[x], texts[y], 5)  # noqa: E731
    else:
        sim = lambda x, y: np.count_nonzero(sigs[x] == sigs[y]) / 128  # noqa: E731
    assert sim(0, 1) >= 0.75 and sim(1, 2) >= 0.75 and sim(0, 2) < 0.75, "the planted chain is not a chain"
    kept, removed, _ = run_stage(texts, cfg, tmp_path)
    assert kept == ["d0", "d2"] and removed == {"d1": ("d0", sim(0, 1))}
    assert reference_near_dedup(texts, cfg) == {1: (0, sim(0, 1))}


def test_bucket_cap_is_counted_and_bounds_pairs(tmp_path):
    # 40 copies of one text share every bucket: 780 pairs per band, 40*3 - 6 with a cap of 3.
    rng = random.Random(2)
    base = " ".join(rng.choice(["x", "y", "z", "w", "v", "u"]) + str(rng.randrange(999)) for _ in range(80))
    texts = [base] * 40 + ["something else entirely, unrelated words here"]
    capped = NearDedupConfig(workers=1, bucket_cap=3)
    kept, removed, stats = run_stage(texts, capped, tmp_path)
    assert kept == ["d0", "d40"] and all(t == ("d0", 1.0) for t in removed.values()) and len(removed) == 39
    assert stats["bucket_cap_hits"] == 36 * stats["lsh_bands"]
    assert stats["candidate_pairs"] == 40 * 3 - 6


def test_spill_folder_removed_when_the_stage_fails(tmp_path):
    texts = planted_corpus(20, seed=1)
    docs = [Document(f"d{i}", "s", t) for i, t in enumerate(texts)]
    path = write_table_atomic(documents_table(docs), tmp_path / "in.parquet")
    (tmp_path / "blocker").write_text("a file where the removed file's folder should be")
    with pytest.raises(OSError):
        near_dedup(path, tmp_path / "kept.parquet", tmp_path / "blocker" / "removed.parquet", NearDedupConfig(workers=1))
    assert not list(tmp_path.glob(".near-spill-*"))
    assert not (tmp_path / "kept.parquet").exists()
