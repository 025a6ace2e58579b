"""verify="estimate" (tasks/data/minhash_estimate.py): a candidate pair with a short document is
verified exactly from 64-bit shingle sets, so distinct texts whose 32-bit shingle hashes collide
are never removed (issue 26); longer pairs keep the MinHash estimate, lowered to what the two
sets' sizes and digests allow, so a similarity of 1.0 always means identical sets."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from tasks.data import minhash_signatures
from tasks.data.documents import DOCUMENT_SCHEMA
from tasks.data.minhash_estimate import spill_limit
from tasks.data.minhash_signatures import _xxh3_shingle_hashes, distinct_sets, unique_shingle_sets
from tasks.data.near_dedup import NearDedupConfig, compute_signatures, near_dedup
from tests.helpers.near_dedup import SURE_CANDIDATES, gram_set, jaccard, pair_with_shingles, run
from tests.helpers.parquet import write_table_atomic

COLLIDING = ("r79641", "r14149")  # one 32-bit xxh3 shingle hash (seed 1), issue 26


def test_the_pair_collides_and_its_estimate_is_one():
    a, b = COLLIDING
    assert len(set(_xxh3_shingle_hashes(pa.array([a, b]), 5, 1)[0].tolist())) == 1
    sigs = compute_signatures([a, b], NearDedupConfig(workers=1))
    assert np.array_equal(sigs[0], sigs[1])  # the estimate alone would remove b as identical


@pytest.mark.parametrize("extra", [{}, SURE_CANDIDATES, {"num_perm": 16}])
def test_colliding_one_word_texts_are_kept_in_estimate_mode(tmp_path, extra):
    a, b = COLLIDING
    cfg = NearDedupConfig(workers=1, verify="estimate", **extra)
    kept, removed, stats = run([a, b, a + " x", b + " x", a], cfg, tmp_path)
    # Only the true copy goes, as identical (was: b and "b x" too, at similarity 1.0).
    assert removed.to_pylist()[0]["doc_id"] == "d4" and removed.num_rows == 1 and kept.num_rows == 4
    assert removed.to_pylist()[0]["similarity"] == 1.0 and removed.to_pylist()[0]["duplicate_of"] == "d0"
    assert stats["verified_exact"] >= 2 and stats["estimate_short_sets"] == 5


def test_forced_32_bit_collisions_of_short_texts_remove_nothing(tmp_path, monkeypatch):
    # Shingle hashes whose upper 32 bits (the signatures') take 16 values, their 64 bits still distinct:
    # short texts of unrelated words then share many signatures, estimate 1.0.
    real = minhash_signatures._xxh3_shingle_hashes64

    def colliding(texts, ngram, seed):
        wide, counts = real(texts, ngram, seed)
        return (wide & np.uint64(0xFFFFFFFF)) | ((wide >> np.uint64(60)) << np.uint64(32)), counts

    monkeypatch.setattr(minhash_signatures, "_xxh3_shingle_hashes64", colliding)
    rng = random.Random(1)
    texts = [" ".join(f"u{rng.randrange(10**12)}" for _ in range(rng.randint(1, 4))) for _ in range(400)]
    cfg = NearDedupConfig(workers=1, ngram=2, verify="estimate")
    sigs = compute_signatures(texts, cfg)
    same = sum(np.array_equal(sigs[i], sigs[j]) for i in range(len(texts)) for j in range(i))
    assert same >= 100, "the forced collisions no longer make equal signatures"
    kept, removed, stats = run(texts, cfg, tmp_path)
    assert removed.num_rows == 0 and kept.num_rows == 400
    assert stats["verified_exact"] >= same and stats["estimate_short_sets"] == 400


def test_many_distinct_one_word_texts_lose_none_in_estimate_mode(tmp_path):
    words = [f"r{i}" for i in range(100_000)]  # holds the colliding pair
    hashes = _xxh3_shingle_hashes(pa.array(words), 5, 1)[0]
    assert len(np.unique(hashes)) < len(words)
    n = len(words)
    table = pa.table({"doc_id": [f"d{i}" for i in range(n)], "source": pa.array(["web"] * n), "text": words,
                      "licence": pa.nulls(n, pa.string()), "path": pa.nulls(n, pa.string()),
                      "locator": pa.nulls(n, pa.string())}, schema=DOCUMENT_SCHEMA)
    path = write_table_atomic(table, tmp_path / "in.parquet")
    result = near_dedup(path, tmp_path / "kept.parquet", tmp_path / "removed.parquet",
                        NearDedupConfig(workers=1, verify="estimate"))
    assert result.stats["candidate_pairs"] >= 1 and result.stats["verified_exact"] >= 1
    assert result.stats["verified_pairs"] == 0 and result.counts["web"] == {"in": n, "out": n}


def test_short_pairs_are_decided_by_the_exact_jaccard(tmp_path):
    rng = random.Random(4)
    short, limit = spill_limit(128, 0.7)
    assert (short, limit) == (32, 45)
    texts, expected = [], {}
    # S = 20: J = 15/25 = 0.6 (kept); S = 29: J = 24/34 = 0.706; S = 40 (over `short`, under `limit`): 35/45 = 0.778.
    for k in range(60):
        a, b = pair_with_shingles(rng, (20, 29, 40)[k % 3])
        if jaccard(a, b) >= 0.7:
            expected[f"d{len(texts) + 1}"] = (f"d{len(texts)}", jaccard(a, b))
        texts += [a, b]
    _, removed, stats = run(texts, NearDedupConfig(workers=1, threshold=0.7, verify="estimate", **SURE_CANDIDATES),
                            tmp_path)
    assert {r["doc_id"]: (r["duplicate_of"], r["similarity"]) for r in removed.to_pylist()} == expected
    assert len(expected) == 40 and stats["verified_exact"] == stats["candidate_pairs"] >= 40


def size_bound(a: set, b: set) -> float:
    if a == b:
        return 1.0
    return (len(a) - 1) / (len(a) + 1) if len(a) == len(b) else min(len(a), len(b)) / max(len(a), len(b))


def test_long_near_duplicates_are_still_removed_by_the_estimate(tmp_path):
    rng = random.Random(7)
    texts = []
    for k in range(40):
        words = [f"w{rng.randrange(10**9)}" for _ in range(2000 if k % 2 else 200)]
        copy = list(words)
        for pos in rng.sample(range(len(words)), k % 3):  # 0 to 2 words replaced: J >= 0.9
            copy[pos] = f"new{rng.randrange(10**9)}"
        texts += [" ".join(words), " ".join(copy)]
    cfg = NearDedupConfig(workers=1, verify="estimate", **SURE_CANDIDATES)
    sigs = compute_signatures(texts, cfg)
    kept, removed, stats = run(texts, cfg, tmp_path)
    assert kept.num_rows == 40 and removed.num_rows == 40 and stats["verified_exact"] == 0
    capped = as_before = 0
    for r in removed.to_pylist():
        doc, target = int(r["doc_id"][1:]), int(r["duplicate_of"][1:])
        assert doc == target + 1
        estimate = np.count_nonzero(sigs[doc] == sigs[target]) / 128
        a, b = gram_set(texts[doc]), gram_set(texts[target])
        bound = size_bound(a, b)
        # The estimate, lowered to what the sizes allow: never 1.0 for two sets that differ.
        assert r["similarity"] == min(estimate, bound) and (r["similarity"] == 1.0) == (a == b)
        assert bound >= jaccard(texts[doc], texts[target])
        capped += bound < estimate
        as_before += r["similarity"] == estimate
    assert capped == stats["estimate_capped"] >= 1 and as_before >= 30


def test_spill_limit_is_the_least_that_keeps_short_pairs_exact():
    for num_perm in (2, 16, 128, 256, 1000):
        for threshold in (0.05, 0.3, 0.5, 0.7, 0.75, 0.8, 0.85, 0.9, 0.99):
            short, limit = spill_limit(num_perm, threshold)
            assert short == max(1, num_perm // 4) <= limit
            assert short / (limit + 1) < threshold  # a short set and an unkept one: J <= that, below the threshold
            assert limit == short or short / limit >= threshold  # one fewer would not do


def test_distinct_sets_match_unique_shingle_sets_and_digest_the_set():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 30, 200)
    hashes = rng.choice(rng.integers(0, 2**64 - 1, 500, dtype=np.uint64), counts.sum())  # repeats within texts
    flat, distinct, digests = distinct_sets(hashes, counts)
    ref_flat, ref_counts = unique_shingle_sets(hashes, counts)
    assert np.array_equal(flat, ref_flat) and np.array_equal(distinct, ref_counts)
    sets = [frozenset(s.tolist()) for s in np.split(flat, np.cumsum(distinct)[:-1])]
    for i in range(len(sets)):
        for j in range(len(sets)):
            assert (digests[i] == digests[j]) == (sets[i] == sets[j])
    # Hashes of one text that agree but for their lowest bits: the one-key sort ties, the exact sort decides.
    tied = np.array([5, 4, 5, 1 << 40, 4, (1 << 40) + 1], dtype=np.uint64)
    flat, distinct, digests = distinct_sets(tied, np.array([4, 2]))
    assert flat.tolist() == [4, 5, 1 << 40, 4, (1 << 40) + 1] and distinct.tolist() == [3, 2]
    assert distinct_sets(np.empty(0, np.uint64), np.zeros(2, np.int64))[1].tolist() == [0, 0]
