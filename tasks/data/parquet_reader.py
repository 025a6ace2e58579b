"""Parquet source files read row by row in bounded memory, every row accounted for.

Yields ("row:N", {column: value} | Rejection) for every row of the file, N counting from 0
over the whole file, so a collected row's id does not depend on how the file is cut into
row groups. What cannot be read is rejected, naming the row group in the detail, and the
rest of the file goes on:
- not a Parquet file at all (truncated, another format under a .parquet name): one
  `corrupt_file` rejection for the file (its rows cannot be counted);
- a row group that fails to decode (a corrupt page): one `corrupt_row_group` rejection per
  row of it not yet read (the footer gives the count);
- a required column missing: every row `missing_field`, not one rejection for the file;
- invalid UTF-8 in a string cell: that row `invalid_utf8` (pyarrow would raise for the batch);
- a string or binary cell over `max_cell_bytes`: that row `cell_too_long`, with the cell's
  first 64 KiB and the sha256 of the whole cell (as JSONL's over-long lines);
- a row group whose columns inflate past `max_row_group_bytes`: each row `row_group_too_big`,
  never read.
Memory: pages are read as the batches need them (`pre_buffer=False`; pre-buffering holds
a whole compressed column chunk), in slices of about SLICE_BYTES of decoded columns, so
the file's row-group layout does not set the peak.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.data.input_files import NotARegularFile, open_regular
from tasks.data.rejection import Rejection

SLICE_BYTES = 64 << 20  # decoded bytes of the read columns per batch, on average
MAX_CELL_BYTES = 8 << 20  # as JSONL's max_line_bytes
MAX_ROW_GROUP_BYTES = 1 << 30  # decoded bytes of the read columns of one row group
PREFIX_BYTES = 64 << 10  # what an oversize cell keeps of itself for the quarantine file
_READ_BUFFER = 1 << 20


@contextmanager
def open_parquet(path: Path) -> Iterator[pq.ParquetFile | Rejection]:
    """`path` as a ParquetFile reading pages on demand, or the Rejection saying why it is not one."""
    try:
        fh = open_regular(path)
    except NotARegularFile as exc:
        yield Rejection("not_a_regular_file", str(exc))
        return
    with fh:
        try:
            pf = pq.ParquetFile(fh, pre_buffer=False, buffer_size=_READ_BUFFER)
        except pa.ArrowException as exc:
            pf = _not_parquet(path, exc)
        yield pf


def _not_parquet(path: Path, exc: Exception) -> Rejection:
    return Rejection("corrupt_file", f"{path}: not a readable Parquet file ({type(exc).__name__}: {str(exc)[:300]}); "
                         "re-export it, or fix the source's kind if it is not Parquet")


def parquet_records(
    path: Path, columns: list[str], required: tuple[str, ...] = (),
    max_cell_bytes: int = MAX_CELL_BYTES, max_row_group_bytes: int = MAX_ROW_GROUP_BYTES,
) -> Iterator[tuple[str, dict | Rejection]]:
    """Yield ("row:N", {column: value} | Rejection) for every row, with only those of `columns`
    the file has; a missing `required` column rejects every row (module docstring)."""
    with open_parquet(path) as pf:
        if isinstance(pf, Rejection):
            yield "file", pf
            return
        names = pf.schema_arrow.names
        missing = [c for c in required if c not in names]
        present = [c for c in dict.fromkeys(columns) if c in names]
        meta = pf.metadata
        row = 0
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            if missing:
                why = Rejection("missing_field", f"no column {missing[0]!r} in {path.name} (columns: {names[:20]})")
                yield from ((f"row:{r}", why) for r in range(row, row + n))
            elif not present:  # every row is still a record (with nothing in it), so none goes uncounted
                yield from ((f"row:{r}", {}) for r in range(row, row + n))
            else:
                yield from _row_group(pf, path, group, row, present, max_cell_bytes, max_row_group_bytes)
            row += n


def _row_group(
    pf: pq.ParquetFile, path: Path, group: int, first: int, present: list[str], max_cell_bytes: int, max_bytes: int
) -> Iterator[tuple[str, dict | Rejection]]:
    rg = pf.metadata.row_group(group)
    n = rg.num_rows
    # Leaf columns of the wanted fields: a nested field has several.
    size = sum(rg.column(i).total_uncompressed_size for i in range(rg.num_columns)
               if rg.column(i).path_in_schema.split(".")[0] in present)
    if size > max_bytes:
        why = Rejection("row_group_too_big", f"row group {group} of {path.name}: columns {present} decode to {size} bytes, "
                        f"over max_row_group_bytes={max_bytes}; rewrite the file with smaller row groups or raise "
                        "max_row_group_bytes in the source's catalog entry")
        yield from ((f"row:{r}", why) for r in range(first, first + n))
        return
    done = 0
    try:
        for batch in pf.iter_batches(batch_size=max(1, SLICE_BYTES * n // max(size, 1)), row_groups=[group], columns=present):
            records = batch_records(batch, group, first + done, max_cell_bytes)
            done += batch.num_rows
            yield from records
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowException) and exc.errno is not None:
            raise  # the file system's error (EIO, a vanished file): the collect task retries it
        # pyarrow reports damaged pages as ArrowInvalid or as OSError without an errno ("Corrupt
        # snappy compressed data"); retrying reads the same bytes, so it is the data's fault.
        why = Rejection("corrupt_row_group", f"row group {group} of {path.name} failed to decode after row {first + done} "
                        f"({type(exc).__name__}: {str(exc)[:300]}); its remaining rows were not read")
        yield from ((f"row:{r}", why) for r in range(first + done, first + n))


def batch_records(batch: pa.RecordBatch, group: int | None, first: int, max_cell_bytes: int = MAX_CELL_BYTES) -> list[tuple[str, dict | Rejection]]:
    """The rows of one decoded batch (rows first.. of the file, in row group `group` or None),
    as a list: so a decoding error of the batch is raised before any of its rows is yielded."""
    bad: dict[int, Rejection] = {}
    values: dict[str, list] = {}
    for name, arr in zip(batch.schema.names, batch.columns):
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_binary(arr.type) \
                or pa.types.is_large_binary(arr.type):
            lengths = pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False)
            over = np.flatnonzero(lengths > max_cell_bytes)
            for i in over.tolist():
                bad.setdefault(i, _too_long(arr[i], name, group, first + i, max_cell_bytes))
            if len(over):  # never turned into Python objects
                mask = np.zeros(len(arr), dtype=bool)
                mask[over] = True
                arr = pc.if_else(pa.array(mask), pa.nulls(len(arr), arr.type), arr)
        try:
            values[name] = arr.to_pylist()
        except UnicodeDecodeError:  # invalid UTF-8 somewhere in the column: find the rows
            values[name] = [_cell(arr, i, name, group, first, bad) for i in range(len(arr))]
    rows = []
    for i in range(batch.num_rows):
        rej = bad.get(i)
        rows.append((f"row:{first + i}", rej if rej is not None else {k: v[i] for k, v in values.items()}))
    return rows


def _where(group: int | None) -> str:
    return "" if group is None else f"row group {group}, "


def _cell(arr: pa.Array, i: int, column: str, group: int, first: int, bad: dict[int, Rejection]):
    try:
        return arr[i].as_py()
    except UnicodeDecodeError as exc:
        raw = arr.cast(pa.large_binary())[i].as_py() if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else None
        bad.setdefault(i, Rejection("invalid_utf8", f"column {column!r}, {_where(group)}row {first + i}: {exc.reason} at byte {exc.start}",
                                    raw=raw[:PREFIX_BYTES] if raw else None, text=(raw or b"")[:PREFIX_BYTES].decode("utf-8", "replace")))
        return None


def _too_long(cell: pa.Scalar, column: str, group: int, row: int, cap: int) -> Rejection:
    buf = cell.as_buffer()  # the cell's bytes in Arrow's memory: hashed in place, not copied into Python
    prefix = buf[:PREFIX_BYTES].to_pybytes()
    return Rejection.with_prefix(
        "cell_too_long",
        f"column {column!r}, {_where(group)}row {row}: {buf.size} bytes, over max_cell_bytes={cap}; "
        f"sha256 of the cell={hashlib.sha256(buf).hexdigest()}; raw holds its first {len(prefix)} bytes; "
        "raise max_cell_bytes in the source's catalog entry to read it",
        prefix,
    )
