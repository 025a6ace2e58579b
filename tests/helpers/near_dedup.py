"""Near-duplicate inputs with known answers (pairs of a set 5-gram Jaccard, edited copies), and near_dedup on texts."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.data.documents import Document, documents_table
from tasks.data.near_dedup import NearDedupConfig, near_dedup
from tests.helpers.parquet import write_table_atomic


def gram_set(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """The word `n`-grams of `text` (the whole text as one when it is shorter)."""
    words = text.split()
    return {tuple(words)} if len(words) <= n else {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: str, b: str) -> float:
    """The exact Jaccard similarity of the word 5-gram sets of `a` and `b`."""
    sa, sb = gram_set(a), gram_set(b)
    return len(sa & sb) / len(sa | sb)


def pair_with_shingles(rng: random.Random, shingles: int) -> tuple[str, str]:
    """A text of distinct words with `shingles` 5-grams and a copy with one middle word replaced:
    5 of its shingles change, so J = (S - 5) / (S + 5) exactly."""
    words = [f"w{rng.randrange(10**9)}x{i}" for i in range(shingles + 4)]
    copy = list(words)
    copy[len(words) // 2] = f"new{rng.randrange(10**9)}"
    return " ".join(words), " ".join(copy)


def run(texts: list[str], cfg: NearDedupConfig, tmp: Path) -> tuple[pa.Table, pa.Table, dict]:
    """near_dedup of `texts` (ids d0.., sources web and code) under tmp: (kept, removed, stats)."""
    docs = [Document(f"d{i}", "web" if i % 3 else "code", t) for i, t in enumerate(texts)]
    path = write_table_atomic(documents_table(docs), tmp / "in.parquet")
    result = near_dedup(path, tmp / "out" / "kept.parquet", tmp / "out" / "removed.parquet", cfg)
    return pq.read_table(tmp / "out" / "kept.parquet"), pq.read_table(tmp / "out" / "removed.parquet"), result.stats


# Many bands of few rows: every pair above J ~ 0.5 is a candidate, so only verification decides.
SURE_CANDIDATES = {"bands": 32, "rows": 4}


def make_variant(words: list[str], edits: int, vocab: list[str], rng: random.Random) -> list[str]:
    """Replace or insert `edits` words at random distinct positions."""
    out = list(words)
    for pos in sorted(rng.sample(range(len(words)), edits), reverse=True):
        if rng.random() < 0.5:
            out[pos] = rng.choice(vocab)
        else:
            out.insert(pos, rng.choice(vocab))
    return out
