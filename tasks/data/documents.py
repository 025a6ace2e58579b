"""The one document schema that flows through every data stage, and atomic Parquet I/O.

A stage reads a Parquet file of documents and writes (a) the documents it keeps and
(b) the documents it removes, with the stage name and the reason, so that every input
document ends in exactly one place.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.workspace.atomic import atomic_path, commit_atomic

SCHEMA_VERSION = 1

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("licence", pa.string()),
        pa.field("path", pa.string()),  # file the document came from
        pa.field("locator", pa.string()),  # where in that file: "line:12", "row:3", "file", ...
    ]
)

# Removed or rejected documents: the document columns plus why, and where it went.
REMOVED_SCHEMA = pa.schema(
    list(DOCUMENT_SCHEMA)
    + [
        pa.field("stage", pa.string(), nullable=False),  # collect, exact_dedup, near_dedup, quality, mix
        pa.field("reason", pa.string(), nullable=False),  # rule name or rejection reason
        pa.field("detail", pa.string()),  # measured value, error message, ...
        pa.field("duplicate_of", pa.string()),  # kept doc_id, for duplicates
        pa.field("similarity", pa.float64()),  # Jaccard (exact, or estimated: near dedup's verify), for near duplicates
        pa.field("raw", pa.binary()),  # original bytes of a record that could not be decoded
    ]
)


# Columns whose values repeat from row to row (a source, a licence, a file, a reason): only
# there do dictionary pages and min/max statistics pay; on texts and ids they cost CPU
# and save nothing (docs/experiments/2026-12-04-data-stages-memory.md).
_REPEATING_COLUMNS = ("source", "licence", "path", "stage", "reason")


def writer_options(schema: pa.Schema) -> dict[str, list[str]]:
    """ParquetWriter options of the data stages' files: dictionaries and statistics on repeating columns only."""
    cols = [f.name for f in schema if f.name in _REPEATING_COLUMNS]
    return {"use_dictionary": cols, "write_statistics": cols}


def make_doc_id(source: str, path: str, locator: str) -> str:
    """A stable id: the same record of the same source gets the same id on every run."""
    digest = hashlib.sha1(f"{source}\x1f{path}\x1f{locator}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"{source}-{digest[:16]}"


@dataclass
class Document:
    """One document of DOCUMENT_SCHEMA."""

    doc_id: str
    source: str
    text: str
    licence: str | None = None
    path: str | None = None
    locator: str | None = None


@dataclass(kw_only=True)
class Removed(Document):
    """A document a stage dropped (or a record it could not read), and why."""

    stage: str
    reason: str
    detail: str | None = None
    duplicate_of: str | None = None
    similarity: float | None = None
    raw: bytes | None = field(default=None, repr=False)


def _rows_table(rows: Iterable, row_type: type, schema: pa.Schema) -> pa.Table:
    dicts = [asdict(r) if isinstance(r, row_type) else r for r in rows]
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in dicts], schema=schema)


def documents_table(docs: Iterable[Document | dict]) -> pa.Table:
    return _rows_table(docs, Document, DOCUMENT_SCHEMA)


def removed_table(rows: Iterable[Removed | dict]) -> pa.Table:
    return _rows_table(rows, Removed, REMOVED_SCHEMA)


def as_documents(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """A batch read from a documents file, as a table of exactly DOCUMENT_SCHEMA."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    return table.select(DOCUMENT_SCHEMA.names).cast(DOCUMENT_SCHEMA)


def removed_from_documents(
    table: pa.Table,
    stage: str,
    reasons: list[str],
    details: list[str | None] | None = None,
    duplicate_of: list[str | None] | None = None,
    similarity: list[float | None] | None = None,
) -> pa.Table:
    """Turn a table of documents into removed rows, column-wise (no per-row Python objects)."""
    n = table.num_rows
    cols = {name: table.column(name) for name in DOCUMENT_SCHEMA.names}
    cols["stage"] = pa.array([stage] * n, pa.string())
    cols["reason"] = pa.array(reasons, pa.string())
    cols["detail"] = pa.array(details if details is not None else [None] * n, pa.string())
    cols["duplicate_of"] = pa.array(duplicate_of if duplicate_of is not None else [None] * n, pa.string())
    cols["similarity"] = pa.array(similarity if similarity is not None else [None] * n, pa.float64())
    cols["raw"] = pa.array([None] * n, pa.binary())
    return pa.table(cols, schema=REMOVED_SCHEMA)


def iter_batches(
    source: Path | pq.ParquetFile, batch_size: int = 4096, columns: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream a Parquet file in record batches, so stages run in bounded memory.

    One reader per row group: a single `ParquetFile.iter_batches` over the whole file keeps
    the string columns it has decoded until it is exhausted (memory growing with the file,
    apache/arrow#39808), while a reader per row group holds one group at most, and reads faster
    too (docs/experiments/2026-12-04-data-stages-memory.md).
    """
    pf = source if isinstance(source, pq.ParquetFile) else pq.ParquetFile(source)
    for group in range(pf.num_row_groups):
        yield from pf.iter_batches(batch_size=batch_size, row_groups=[group], columns=columns)


def text_byte_slices(texts: pa.Array | pa.ChunkedArray | Sequence[str], limit: int) -> list[tuple[int, int]]:
    """(start, stop) ranges cutting `texts` into consecutive runs of at most `limit` bytes of
    text each (a longer text forms a run alone), so work on a run costs bounded memory
    whatever the documents' lengths."""
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        lengths = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False)
    else:
        lengths = np.fromiter((len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lengths, dtype=np.int64)
    out, i = [], 0
    while i < len(ends):
        j = max(i + 1, int(np.searchsorted(ends, (ends[i - 1] if i else 0) + limit, side="right")))
        out.append((i, j))
        i = j
    return out


class TableWriter:
    """Stream record batches into one Parquet file, atomically renamed on close."""

    def __init__(self, final: Path, schema: pa.Schema, compression: str = "zstd"):
        self.final = Path(final)
        self.tmp = atomic_path(self.final)
        self.schema = schema
        self.rows = 0
        self._writer = pq.ParquetWriter(self.tmp, schema, compression=compression, **writer_options(schema))

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if table.num_rows:
            if isinstance(table, pa.RecordBatch):
                table = pa.Table.from_batches([table])
            self._writer.write_table(table.cast(self.schema))
            self.rows += table.num_rows

    def close(self) -> Path:
        self._writer.close()
        commit_atomic(self.tmp, self.final)
        return self.final

    def abort(self) -> None:
        self._writer.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "TableWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
