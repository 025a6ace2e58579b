"""Near dedup: signatures match datasketch bit for bit, planted near-duplicates are found
at the right similarities, results are deterministic, bad configs fail clearly."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash

from infra.config import ConfigError, parse_config
from tasks.data.documents import REMOVED_SCHEMA, Document, documents_table
from tasks.data.minhash_signatures import shingles
from tasks.data.near_dedup import NearDedupConfig, compute_signatures, near_dedup
from tests.helpers.near_dedup import make_variant
from tests.helpers.parquet import write_table_atomic


def write_docs(path: Path, docs: list[Document]) -> Path:
    return write_table_atomic(documents_table(docs), path)


def random_vocab(rng: random.Random, size: int = 20000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(size)]


def exact_jaccard(a: str, b: str, n: int = 5) -> float:
    sa, sb = set(shingles(a, n)), set(shingles(b, n))
    return len(sa & sb) / len(sa | sb)


# Edits per variant: 0-2 edits of 200 words give J >= 0.9, 10 or more give J <= 0.6.
EDITS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 17, 20, 24, 28, 32]


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    """300 groups of (base, variant) with the variant's exact 5-gram Jaccard to its base spanning ~0.3..1.0."""
    rng = random.Random(7)
    vocab = random_vocab(rng)
    docs: list[Document] = []
    jaccard: dict[int, float] = {}
    for g in range(300):
        base = [rng.choice(vocab) for _ in range(200)]
        variant = make_variant(base, EDITS[g % len(EDITS)], vocab, rng)
        a, b = " ".join(base), " ".join(variant)
        jaccard[g] = exact_jaccard(a, b)
        source = "web" if g % 2 else "code"
        docs.append(Document(doc_id=f"b{g}", source=source, text=a))
        docs.append(Document(doc_id=f"v{g}", source=source, text=b))
    path = write_docs(tmp_path_factory.mktemp("planted") / "docs.parquet", docs)
    return path, jaccard


def test_shingles_short_and_empty_documents():
    assert shingles("a b c d e f", 5) == ["a b c d e", "b c d e f"]
    assert shingles("  a\tb \n c ", 5) == ["a b c"]  # shorter than n: the whole word sequence
    assert shingles("a b c d e", 5) == ["a b c d e"]
    assert shingles(" \n ", 5) == []


@pytest.mark.parametrize("scheme", ["affine32", "affine64", "legacy"])
def test_signatures_equal_datasketch(scheme):
    rng = random.Random(3)
    words = ["x", "yy", "zzz", "ab", "ü", "日本語", "q"]
    texts = ["", "one", "two words", "héllo wörld ünïcode テキスト", "a b c d e", "a b c d e f"]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(100)]
    cfg = NearDedupConfig(num_perm=64, seed=5, scheme=scheme, batch_size=16, workers=1)
    sigs = compute_signatures(texts, cfg)
    assert sigs.shape == (len(texts), 64)
    for text, sig in zip(texts, sigs):
        ref = MinHash(64, seed=5, scheme=scheme)
        for gram in shingles(text, cfg.ngram):
            ref.update(gram.encode("utf-8"))
        assert sig.dtype == ref.hashvalues.dtype
        assert np.array_equal(sig, ref.hashvalues), f"signature differs from datasketch for {text!r}"


def test_signatures_split_long_documents_across_chunks():
    # A document longer than one permutation chunk (2^20 cells / 128 perms = 8192 shingles).
    rng = random.Random(1)
    text = " ".join(str(rng.randrange(10**6)) for _ in range(20000))
    cfg = NearDedupConfig(workers=1, scheme="affine32")
    ref = MinHash(128, seed=1)
    ref.update_batch([g.encode() for g in shingles(text, 5)])
    assert np.array_equal(compute_signatures(["a b", text, "c"], cfg)[1], ref.hashvalues)


def test_planted_near_duplicates_recall_and_false_positives(planted, tmp_path):
    path, jaccard = planted
    cfg = NearDedupConfig(threshold=0.8, workers=1)
    result = near_dedup(path, tmp_path / "kept.parquet", tmp_path / "removed.parquet", cfg)
    removed = pq.read_table(tmp_path / "removed.parquet")
    assert removed.schema.equals(REMOVED_SCHEMA)
    rows = removed.to_pylist()
    # Bases are unrelated random text: only variants may be removed, and only as copies of their base.
    assert all(r["doc_id"].startswith("v") and r["duplicate_of"] == "b" + r["doc_id"][1:] for r in rows)
    found = {int(r["doc_id"][1:]): r["similarity"] for r in rows}
    high = [g for g, j in jaccard.items() if j >= 0.9]
    low = [g for g, j in jaccard.items() if j <= 0.6]
    recall_high = sum(g in found for g in high) / len(high)
    fp_low = sum(g in found for g in low) / len(low)
    at_threshold = [g for g, j in jaccard.items() if j >= 0.8]
    precision = sum(jaccard[g] >= 0.7 for g in found) / max(len(found), 1)
    print(
        f"\nplanted pairs: {len(jaccard)} (J>=0.9: {len(high)}, J<=0.6: {len(low)}); "
        f"recall@J>=0.9 = {recall_high:.3f}, recall@J>=0.8 = {sum(g in found for g in at_threshold) / len(at_threshold):.3f}, "
        f"false positives@J<=0.6 = {fp_low:.3f}, removed with J>=0.7 = {precision:.3f}"
    )
    assert len(high) >= 30 and len(low) >= 50, "the generator no longer spans the Jaccard range"
    assert recall_high >= 0.9
    assert fp_low <= 0.05
    # Candidates are verified exactly (verify="exact"): the similarity is the exact Jaccard, and
    # nothing below the threshold is removed.
    assert all(found[g] == jaccard[g] >= 0.8 for g in found)
    result.check_conservation()
    assert sum(c["in"] for c in result.counts.values()) == 600
    assert sum(c["near_duplicate"] for c in result.counts.values() if "near_duplicate" in c) == len(found)
    assert pq.read_metadata(tmp_path / "kept.parquet").num_rows == 600 - len(found)
    assert result.stats["clusters_with_removals"] == len(found)
    assert result.stats["mean_similarity_removed"] == pytest.approx(np.mean(list(found.values())))


def test_keep_rule_first_copy_and_most_similar(tmp_path):
    rng = random.Random(11)
    vocab = random_vocab(rng, 5000)
    a = [rng.choice(vocab) for _ in range(150)]
    b = [rng.choice(vocab) for _ in range(150)]
    near_a = make_variant(a, 1, vocab, rng)
    docs = [
        Document("a", "s", " ".join(a)),
        Document("b", "s", " ".join(b)),
        Document("a-copy", "t", " ".join(a)),
        Document("a-near", "t", " ".join(near_a)),
        Document("empty1", "s", "   "),
        Document("empty2", "s", ""),
    ]
    path = write_docs(tmp_path / "in.parquet", docs)
    result = near_dedup(path, tmp_path / "out.parquet", tmp_path / "rem.parquet", NearDedupConfig(workers=1))
    kept = pq.read_table(tmp_path / "out.parquet").column("doc_id").to_pylist()
    assert kept == ["a", "b", "empty1", "empty2"]  # input order; empty texts are never compared
    rem = {r["doc_id"]: r for r in pq.read_table(tmp_path / "rem.parquet").to_pylist()}
    assert rem["a-copy"]["duplicate_of"] == "a" and rem["a-copy"]["similarity"] == 1.0
    assert rem["a-near"]["duplicate_of"] == "a" and 0.8 <= rem["a-near"]["similarity"] < 1.0
    assert {r["stage"] for r in rem.values()} == {"near_dedup"}
    assert result.counts == {"s": {"in": 4, "out": 4}, "t": {"in": 2, "out": 0, "near_duplicate": 2}}
    assert result.stats["unindexed_empty"] == 2


def test_deterministic_and_empty_removed_file_written(planted, tmp_path):
    path, _ = planted
    cfg = NearDedupConfig(workers=1, batch_size=97)  # batches cut groups apart
    tables = []
    for run in ("one", "two"):
        near_dedup(path, tmp_path / run / "out.parquet", tmp_path / run / "rem.parquet", cfg)
        tables.append((pq.read_table(tmp_path / run / "out.parquet"), pq.read_table(tmp_path / run / "rem.parquet")))
    assert tables[0][0].equals(tables[1][0]) and tables[0][1].equals(tables[1][1])
    single = near_dedup(path, tmp_path / "b" / "out.parquet", tmp_path / "b" / "rem.parquet", NearDedupConfig(workers=1))
    assert pq.read_table(tmp_path / "b" / "rem.parquet").equals(tables[0][1]), "batch size changed the result"
    # A corpus with nothing to remove still gets its (empty) removed file.
    few = write_docs(tmp_path / "few.parquet", [Document("x", "s", "alpha beta gamma delta epsilon zeta")])
    res = near_dedup(few, tmp_path / "f" / "out.parquet", tmp_path / "f" / "rem.parquet", NearDedupConfig(workers=1))
    assert pq.read_metadata(tmp_path / "f" / "rem.parquet").num_rows == 0
    assert res.counts == {"s": {"in": 1, "out": 1}}
    assert single.stats["lsh_bands"] * single.stats["lsh_rows"] <= 128


def test_explicit_banding_is_used(planted, tmp_path):
    path, _ = planted
    result = near_dedup(path, tmp_path / "o.parquet", tmp_path / "r.parquet", NearDedupConfig(workers=1, bands=16, rows=8))
    assert (result.stats["lsh_bands"], result.stats["lsh_rows"]) == (16, 8)


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"bands": 16}, "give both"),
        ({"rows": 8}, "give both"),
        ({"bands": 20, "rows": 8}, "exceeds num_perm"),
        ({"threshold": 1.0}, "threshold"),
        ({"threshold": 0.0}, "threshold"),
        ({"num_perm": 1}, "num_perm"),
        ({"ngram": 0}, "ngram"),
        ({"workers": -1}, "workers"),
        ({"scheme": "md5"}, "scheme"),
        ({"treshold": 0.7}, "treshold"),
    ],
)
def test_config_validation_names_the_key(bad, words):
    with pytest.raises(ConfigError, match=words):
        parse_config(NearDedupConfig, bad, "preset.yaml:near")


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="exact_dedup stage first"):
        near_dedup(tmp_path / "nope.parquet", tmp_path / "o.parquet", tmp_path / "r.parquet", NearDedupConfig())


@pytest.mark.slow
def test_worker_processes_give_the_same_result(planted, tmp_path):
    path, _ = planted
    one = near_dedup(path, tmp_path / "1" / "o.parquet", tmp_path / "1" / "r.parquet", NearDedupConfig(workers=1, batch_size=64))
    two = near_dedup(path, tmp_path / "2" / "o.parquet", tmp_path / "2" / "r.parquet", NearDedupConfig(workers=2, batch_size=64))
    assert two.stats["workers"] == 2 and one.stats["workers"] == 1
    for name in ("o.parquet", "r.parquet"):
        assert pq.read_table(tmp_path / "1" / name).equals(pq.read_table(tmp_path / "2" / name))
    assert one.counts == two.counts
