"""Exact verification of LSH candidates (verify="exact", the default): a pair is a duplicate iff
the Jaccard of its word 5-gram sets reaches the threshold, whatever the MinHash estimate says;
the removed row's similarity is that Jaccard; results do not depend on batches, workers or how
many pairs are merged at once; the shingle sets are the distinct shingle hashes."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from tasks.data import lsh_buckets
from tasks.data.minhash_signatures import _xxh3_shingle_hashes, permutations, signature_job, unique_shingle_sets
from tasks.data.near_dedup import NearDedupConfig
from tests.helpers.near_dedup import SURE_CANDIDATES, gram_set, jaccard, pair_with_shingles, run


def test_exact_threshold_keeps_below_and_removes_at_and_above(tmp_path):
    rng = random.Random(12)
    texts, expected = [], {}
    # S = 44: J = 39/49 = 0.796 (kept); S = 45: J = 40/50 = 0.8 (removed, at the threshold);
    # S = 46: J = 41/51 = 0.804 (removed). Estimates (sd ~0.035) would get many of these wrong.
    for k in range(60):
        s = (44, 45, 46)[k % 3]
        a, b = pair_with_shingles(rng, s)
        assert jaccard(a, b) == (s - 5) / (s + 5)
        if jaccard(a, b) >= 0.8:
            expected[f"d{len(texts) + 1}"] = (f"d{len(texts)}", jaccard(a, b))
        texts += [a, b]
    kept, removed, stats = run(texts, NearDedupConfig(workers=1, threshold=0.8, **SURE_CANDIDATES), tmp_path / "x")
    got = {r["doc_id"]: (r["duplicate_of"], r["similarity"]) for r in removed.to_pylist()}
    assert got == expected  # similarity == the exact Jaccard of the 5-gram tuple sets, bit for bit
    assert len(expected) == 40 and kept.num_rows == 80
    assert stats["verify"] == "exact" and stats["verified_exact"] >= 60 and stats["verified_pairs"] == 40
    # The estimate on the same corpus misjudges some of these pairs (why exact is the default).
    _, est_removed, est_stats = run(texts, NearDedupConfig(workers=1, threshold=0.8, verify="estimate", **SURE_CANDIDATES),
                                    tmp_path / "e")
    est = {r["doc_id"] for r in est_removed.to_pylist()}
    assert est != set(expected) and est_stats["verified_exact"] == 0


def test_similarity_is_exact_jaccard_on_edited_copies(tmp_path):
    rng = random.Random(3)
    vocab = [f"v{i}" for i in range(400)]  # small vocabulary: repeated words and shingles
    texts = []
    for _ in range(40):
        base = [rng.choice(vocab) for _ in range(rng.randint(50, 150))]
        copy = list(base)
        for pos in sorted(rng.sample(range(len(base)), rng.randint(0, 4)), reverse=True):
            if rng.random() < 0.5:
                copy.insert(pos, rng.choice(vocab))
            else:
                copy[pos] = rng.choice(vocab)
        texts += [" ".join(base), "  " + " ".join(copy) + "\n"]
    _, removed, _ = run(texts, NearDedupConfig(workers=1, threshold=0.6, **SURE_CANDIDATES), tmp_path)
    rows = removed.to_pylist()
    assert len(rows) >= 30
    for r in rows:
        doc, target = int(r["doc_id"][1:]), int(r["duplicate_of"][1:])
        assert r["similarity"] == jaccard(texts[doc], texts[target]) >= 0.6


def corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6))) for _ in range(3000)]
    texts = []
    for g in range(150):
        base = [rng.choice(vocab) for _ in range(rng.randint(20, 200))]
        for _ in range(1 + g % 4):
            copy = list(base)
            for pos in rng.sample(range(len(base)), rng.randint(0, 4)):
                copy[pos] = rng.choice(vocab)
            texts.append(" ".join(copy))
    rng.shuffle(texts)
    texts[3:3] = ["", "one", "two words", "a b c d e"]
    return texts


def test_independent_of_batch_size_and_merge_chunks(tmp_path, monkeypatch):
    texts = corpus(4)
    cfg = NearDedupConfig(workers=1, threshold=0.7)
    ref = run(texts, cfg.model_copy(update={"batch_size": 1000}), tmp_path / "a")
    assert ref[1].num_rows > 50
    other = run(texts, cfg.model_copy(update={"batch_size": 7}), tmp_path / "b")
    monkeypatch.setattr(lsh_buckets, "_SET_CELLS", 300)  # pairs merged a few at a time
    merged = run(texts, cfg.model_copy(update={"batch_size": 64}), tmp_path / "c")
    for got in (other, merged):
        assert got[0].equals(ref[0]) and got[1].equals(ref[1])


@pytest.mark.slow
def test_worker_processes_give_the_same_result(tmp_path):
    texts = corpus(5)
    one = run(texts, NearDedupConfig(workers=1, batch_size=64, threshold=0.7), tmp_path / "1")
    two = run(texts, NearDedupConfig(workers=2, batch_size=64, threshold=0.7), tmp_path / "2")
    assert one[2]["workers"] == 1 and two[2]["workers"] == 2
    assert one[1].num_rows > 50
    assert one[0].equals(two[0]) and one[1].equals(two[1])


@pytest.mark.parametrize("scheme", ["xxh3", "affine32", "affine64", "legacy"])
def test_shingle_sets_and_signatures_in_sets_mode(scheme):
    rng = random.Random(9)
    texts = ["", "one", "a a a a a a a a a a", "x y x y x y x y"] + [
        " ".join(rng.choice(["p", "q", "r", "ss"]) for _ in range(rng.randint(0, 40))) for _ in range(60)
    ]
    perms = permutations(64, 1, scheme)
    sigs, counts, _, none = signature_job(texts, 5, perms, scheme, 1)
    sigs2, counts2, _, (flat, set_counts) = signature_job(texts, 5, perms, scheme, 1, sets=True)
    assert none is None and np.array_equal(sigs, sigs2) and np.array_equal(counts, counts2)
    assert flat.dtype == np.uint64 and set_counts.tolist() == [len(gram_set(t)) if t.split() else 0 for t in texts]
    ends = np.cumsum(set_counts)
    for i, s in enumerate(np.split(flat, ends[:-1])):
        assert np.all(s[1:] > s[:-1])  # sorted and distinct
    if scheme == "xxh3":
        hashes, per_text = _xxh3_shingle_hashes(pa.array(texts), 5, 1)
        starts = np.cumsum(per_text) - per_text
        for i, s in enumerate(np.split(flat, ends[:-1])):
            assert set((s >> np.uint64(32)).tolist()) == set(hashes[starts[i] : starts[i] + per_text[i]].tolist())
    assert unique_shingle_sets(np.empty(0, np.uint64), np.zeros(3, np.int64))[1].tolist() == [0, 0, 0]


def test_distinct_one_word_texts_whose_32_bit_shingle_hashes_collide_are_both_kept(tmp_path):
    # Issue 26: these two words share their 32-bit xxh3 shingle hash (seed 1), so 32-bit
    # shingle sets made them "identical" (similarity 1.0); 1,000,000 one-word documents lost 114 so.
    a, b = "r79641", "r14149"
    assert len(set(_xxh3_shingle_hashes(pa.array([a, b]), 5, 1)[0].tolist())) == 1  # the collision
    for cfg in (NearDedupConfig(workers=1), NearDedupConfig(workers=1, ngram=1), NearDedupConfig(workers=1, **SURE_CANDIDATES)):
        kept, removed, _ = run([a, b, a + " x", b + " x"], cfg, tmp_path / f"{cfg.ngram}-{cfg.bands}")
        assert removed.num_rows == 0 and kept.num_rows == 4
