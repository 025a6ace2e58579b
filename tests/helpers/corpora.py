"""Document tables written as the data flow writes them, for the tests that shard, tokenize or corrupt them."""
from __future__ import annotations

from pathlib import Path

from tasks.data.documents import Document, documents_table, write_table_atomic


def mixed_documents(path: Path, n: int, tag: str) -> Path:
    """`n` documents of ~350 characters (ids `tag`0.., three sources) written to `path` as the mix stage writes them."""
    docs = [
        Document(f"{tag}{i}", f"src{i % 3}", f"{tag} document {i} " + "lorem ipsum dolor sit amet " * 12, "cc0", "p", f"line:{i}")
        for i in range(n)
    ]
    write_table_atomic(documents_table(docs), path)
    return path
