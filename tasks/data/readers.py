"""Readers of source files, shared by pretraining (collect) and SFT sources.

Each reader yields (locator, record | Rejection) and never raises on bad data: a record
that cannot be read (malformed JSON, invalid UTF-8, an over-long line, a corrupt
`.jsonl.gz`) becomes a Rejection with a short machine-readable reason, and the caller
quarantines it. What a record must hold (a text field, a conversation) is the caller's
business.
"""
from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tasks.data.catalog import HfDatasetOptions
from tasks.data.documents import Removed

BATCH_ROWS = 2048


class Rejection(Exception):
    """A record that cannot be used; `reason` is a short machine-readable name.

    `raw` and `text` keep what was read, for the quarantine file."""

    def __init__(self, reason: str, detail: str = "", raw: bytes | None = None, text: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.raw, self.text = reason, detail, raw, text

    def removed(self, doc_id: str, source: Any, path: str, locator: str, stage: str) -> Removed:
        """This rejection as a quarantined row of `source` (a catalog source config)."""
        return Removed(
            doc_id=doc_id, source=source.name, text=self.text or "", stage=stage, reason=self.reason,
            licence=source.licence, path=path, locator=locator, detail=self.detail[:1000], raw=self.raw,
        )


def check_string(value: Any, what: str) -> str:
    """Return `value` if it is usable text, else raise Rejection saying what is wrong with `what`."""
    if value is None:
        raise Rejection("missing_field", f"no {what}")
    if not isinstance(value, str):
        raise Rejection("wrong_type", f"{what} is {type(value).__name__}, expected a string", text=repr(value)[:1000])
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates from JSON escapes
        raise Rejection("invalid_unicode", f"{what}: {exc}", text=value.encode("utf-8", "replace").decode()) from None
    if not value.strip():
        raise Rejection("empty_text", f"{what} is empty or whitespace")
    return value


def decode_utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejection("invalid_utf8", f"byte {exc.start}: {exc.reason}", raw=raw, text=raw.decode("utf-8", "replace")) from None


def _open_lines(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def jsonl_lines(path: Path, max_line_bytes: int) -> Iterator[tuple[str, bytes | Rejection]]:
    """Yield ("line:N", raw line | Rejection) for each non-blank line of a JSONL(.gz) file.

    A line over `max_line_bytes` (its newline counted) is rejected without being held in
    memory; a truncated or corrupt gzip ends the file with one `corrupt_file` rejection."""
    with _open_lines(path) as fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline(max_line_bytes + 1)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                yield f"line:{lineno + 1}", Rejection("corrupt_file", f"{type(exc).__name__}: {exc}")
                return
            if not raw:
                return
            lineno += 1
            locator = f"line:{lineno}"
            if len(raw) > max_line_bytes:
                size = len(raw)
                while raw and not raw.endswith(b"\n"):
                    raw = fh.readline(1 << 20)
                    size += len(raw)
                yield locator, Rejection("line_too_long", f"{size} bytes > max_line_bytes={max_line_bytes}")
                continue
            if raw.strip():  # blank lines are layout, not records
                yield locator, raw


def parse_json_line(raw: bytes) -> tuple[Any, str]:
    """(parsed value | Rejection, the line as text) of one JSONL line."""
    try:
        line = decode_utf8(raw)
    except Rejection as rej:
        return rej, ""
    try:
        return json.loads(line), line
    except (json.JSONDecodeError, RecursionError) as exc:
        return Rejection("malformed_json", str(exc)[:200], raw=raw, text=line[:100_000]), line


def jsonl_records(path: Path, max_line_bytes: int) -> Iterator[tuple[str, Any]]:
    """Yield ("line:N", parsed JSON value | Rejection) for each record of a JSONL(.gz) file."""
    for locator, raw in jsonl_lines(path, max_line_bytes):
        yield locator, raw if isinstance(raw, Rejection) else parse_json_line(raw)[0]


def parquet_columns(path: Path) -> list[str]:
    return pq.ParquetFile(path).schema_arrow.names


def parquet_records(path: Path, columns: list[str]) -> Iterator[tuple[str, dict]]:
    """Yield ("row:N", {column: value}) for every row, with only those of `columns` the file has."""
    pf = pq.ParquetFile(path)
    present = [c for c in dict.fromkeys(columns) if c in pf.schema_arrow.names]
    if not present:  # every row is still a record (with nothing in it), so none goes uncounted
        for row in range(pf.metadata.num_rows):
            yield f"row:{row}", {}
        return
    row = 0
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=present):
        for rec in batch.to_pylist():
            yield f"row:{row}", rec
            row += 1


def hf_dataset(opts: HfDatasetOptions, root: Path):
    """`datasets.load_dataset` with `data_files` resolved against the catalog folder `root`."""
    import datasets

    data_files = opts.data_files
    if data_files is not None:
        files = [data_files] if isinstance(data_files, str) else data_files
        data_files = [str((root / f).resolve()) for f in files]
    return datasets.load_dataset(opts.name, opts.config, data_files=data_files, split=opts.split, revision=opts.revision)
