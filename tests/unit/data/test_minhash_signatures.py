"""The fast xxh3 signature scheme: its shingles are the words of the dedup key (Arrow's split
is Python's), its n-gram hashes match a plain per-document reference, its signatures are the
same in worker processes and on every machine (golden values), and estimate Jaccard well."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import xxhash

from tasks.data.minhash_signatures import _xxh3_shingle_hashes, dedup_keys, shingles
from tasks.data.near_dedup import NearDedupConfig, compute_signatures
from tasks.data.text_normalize import dedup_key

M64 = 1 << 64


def reference_shingle_hashes(text: str, n: int, seed: int) -> list[int]:
    """The scheme's shingle hashes one document at a time, in plain Python integers."""
    words = [xxhash.xxh3_64_intdigest(w, seed) for w in dedup_key(text).split()]
    if not words:
        return []
    if len(words) < n:
        words += [0] * (n - len(words))  # a short text is one shingle of all its words
    out = []
    for i in range(len(words) - n + 1):
        g = 0
        for w in words[i : i + n]:
            g = (g * 0x9E3779B97F4A7C15 + w) % M64
        g ^= g >> 33
        g = g * 0xFF51AFD7ED558CCD % M64
        g ^= g >> 33
        g = g * 0xC4CEB9FE1A85EC53 % M64
        g ^= g >> 33
        out.append(g >> 32)
    return out


TRICKY = [
    "", "   ", "one", "two words", "  lead and trail  ", "a b c d e", "a b c d e f",
    "tab\tsep\nnew line\r\nwindows", "ctrl\x0bin\x0cside\x1fword\x01glued",  # dedup_key drops these controls
    "héllo wörld ﬁne ｆｕｌｌ\u3000width\u00a0nbsp", "zero\u200bwidth\u200djoin", "line\u2028sep\u2029para",
]


def test_arrow_split_is_python_split_for_every_character():
    chars = [chr(c) for c in range(0x3000 + 1) if not 0xD800 <= c < 0xE000]
    texts = pa.array([f"a{c}b{c}{c}c " for c in chars])
    arrow = [[w for w in ws if w] for ws in pc.utf8_split_whitespace(texts).to_pylist()]
    assert arrow == [t.split() for t in texts.to_pylist()]


def test_dedup_keys_only_where_words_change():
    texts = TRICKY + ["plain ascii   text\twith blanks"]
    keyed = dedup_keys(pa.array(texts)).to_pylist()
    assert [k.split() for k in keyed] == [dedup_key(t).split() for t in texts]
    assert keyed[-1] == texts[-1]  # ASCII without controls is left as it is (no Python work)


@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_shingle_hashes_match_reference(ngram):
    rng = random.Random(4)
    texts = TRICKY + [" ".join(rng.choice(["x", "yy", "ü", "日本", "q"]) for _ in range(rng.randint(0, 30))) for _ in range(50)]
    hashes, counts = _xxh3_shingle_hashes(pa.array(texts), ngram, seed=9)
    expected = [reference_shingle_hashes(t, ngram, 9) for t in texts]
    assert counts.tolist() == [len(e) for e in expected] == [len(shingles(dedup_key(t), ngram)) for t in texts]
    assert hashes.tolist() == [h for e in expected for h in e]


def test_signatures_are_stable_golden_values():
    # Fixed values: a change of word hash, fold, seed use or permutation draw changes every
    # stored signature, and every spill and comparison made with the old ones.
    cfg = NearDedupConfig(workers=1)
    sig = compute_signatures(["the quick brown fox jumps over the lazy dog"], cfg)[0]
    assert sig.dtype == np.uint32
    assert sig[:4].tolist() == GOLDEN


GOLDEN = [133816101, 352579346, 160063124, 301330831]


def test_empty_text_gets_the_empty_sketch_and_long_text_spans_chunks():
    rng = random.Random(1)
    long = " ".join(str(rng.randrange(10**6)) for _ in range(20000))  # > one permutation chunk of shingles
    cfg = NearDedupConfig(workers=1)
    sigs = compute_signatures(["", long, "c"], cfg)
    assert (sigs[0] == np.uint32(0xFFFFFFFF)).all()
    alone = compute_signatures([long], cfg.model_copy(update={"batch_size": 1}))[0]
    assert np.array_equal(sigs[1], alone)


@pytest.mark.slow
def test_worker_processes_give_the_same_signatures():
    rng = random.Random(8)
    texts = [" ".join(rng.choice(["a", "b", "c", "dd", "é"]) for _ in range(rng.randint(0, 50))) for _ in range(300)]
    one = compute_signatures(texts, NearDedupConfig(workers=1, batch_size=50))
    two = compute_signatures(texts, NearDedupConfig(workers=2, batch_size=50))
    assert np.array_equal(one, two)


def test_estimates_track_exact_jaccard():
    rng = random.Random(6)
    vocab = [f"w{i}" for i in range(20000)]
    errors = []
    for edits in range(0, 40, 2):
        base = [rng.choice(vocab) for _ in range(300)]
        variant = list(base)
        for pos in rng.sample(range(300), edits):
            variant[pos] = rng.choice(vocab)
        a, b = set(shingles(" ".join(base), 5)), set(shingles(" ".join(variant), 5))
        exact = len(a & b) / len(a | b)
        sigs = compute_signatures([" ".join(base), " ".join(variant)], NearDedupConfig(workers=1))
        errors.append(np.count_nonzero(sigs[0] == sigs[1]) / 128 - exact)
    # Standard error of a 128-permutation estimate is at most 0.044; no bias either way.
    assert max(map(abs, errors)) < 0.15
    assert abs(np.mean(errors)) < 0.03


@pytest.mark.parametrize("scheme", ["xxh3", "affine32"])
def test_a_job_works_in_pieces_of_bounded_text_with_the_same_results(monkeypatch, scheme):
    """signature_job splits its batch by text bytes (bounded memory); the pieces change nothing."""
    from tasks.data import minhash_signatures as ms

    rng = random.Random(3)
    texts = pa.array([" ".join(rng.choice(["a", "b", "cc", "é", "dd"]) for _ in range(rng.randint(0, 400)))
                      for _ in range(120)], pa.string())
    perms = ms.permutations(64, 1, scheme)
    whole = ms.signature_job(texts, 5, perms, scheme, 1, sets=True)
    monkeypatch.setattr(ms, "SUB_BATCH_BYTES", 700)  # about one document per piece
    pieces = ms.signature_job(texts, 5, perms, scheme, 1, sets=True)
    for a, b in [(whole[0], pieces[0]), (whole[1], pieces[1]), (whole[3][0], pieces[3][0]), (whole[3][1], pieces[3][1])]:
        assert np.array_equal(a, b)


def test_text_byte_slices_cover_every_text_once_within_the_limit():
    from tasks.data.documents import text_byte_slices

    texts = ["ab", "cdé", "f" * 10, "g", "h", ""]
    for form in (texts, pa.array(texts)):
        runs = text_byte_slices(form, 4)
        assert runs == [(0, 1), (1, 2), (2, 3), (3, 6)]  # "cdé" is 4 bytes; the 10-byte text stands alone
    assert text_byte_slices([], 4) == []


def test_a_batch_of_fewer_words_than_the_ngram_is_hashed():
    """Found by the conservation property test: two one-word texts (2 words < n = 5) crashed the fold."""
    from tasks.data import minhash_signatures as ms

    perms = ms.permutations(16, 1, "xxh3")
    sigs, counts, _, _ = ms.signature_job(pa.array(["0", "00"]), 5, perms, "xxh3", 1, sets=True)
    assert counts.tolist() == [1, 1]
    alone = [ms.signature_job(pa.array([t]), 5, perms, "xxh3", 1)[0][0] for t in ("0", "00")]
    assert np.array_equal(sigs, np.stack(alone))
