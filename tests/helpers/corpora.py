"""Document tables written as the data flow writes them, for the tests that shard, tokenize or corrupt them."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from infra.workspace.record import sha256_file
from tasks.data.documents import Document, documents_table
from tasks.data.manifest import Manifest, ShardInfo, write_manifest
from tests.helpers.parquet import write_table_atomic


def mixed_documents(path: Path, n: int, tag: str) -> Path:
    """`n` documents of ~350 characters (ids `tag`0.., three sources) written to `path` as the mix stage writes them."""
    docs = [
        Document(f"{tag}{i}", f"src{i % 3}", f"{tag} document {i} " + "lorem ipsum dolor sit amet " * 12, "cc0", "p", f"line:{i}")
        for i in range(n)
    ]
    write_table_atomic(documents_table(docs), path)
    return path


WORDS = "the cat sat on a mat while dogs ran past quickly über naïve café 日本語 данные".split()


def write_corpus(root, shards: list[list[Document]]):
    """Write documents as Parquet shards plus a manifest, the way the data flow does; return the manifest path."""
    root.mkdir(parents=True, exist_ok=True)
    infos = []
    for k, docs in enumerate(shards):
        path = write_table_atomic(documents_table(docs), root / f"shard-{k:05d}.parquet")
        sources: dict[str, int] = {}
        for d in docs:
            sources[d.source] = sources.get(d.source, 0) + 1
        infos.append(ShardInfo(file=path.name, rows=len(docs), bytes=path.stat().st_size, sha256=sha256_file(path), sources=sources))
    return write_manifest(Manifest(shards=infos), root / "manifest.json")


def random_docs(n: int, seed: int = 0, source: str = "web") -> list[Document]:
    """`n` documents of 5-39 words (some accented, CJK or Cyrillic) from `source`, seeded."""
    rng = np.random.default_rng(seed)
    return [
        Document(f"{source}-{i}", source, " ".join(rng.choice(WORDS, size=int(rng.integers(5, 40)))), "MIT", "p", f"line:{i}")
        for i in range(n)
    ]
