"""`hf_dataset` sources: loaded locally through `datasets`, read in Arrow batches, every row counted.

- Where: `tasks.data.catalog.hf_location`: a builder over `data_files`, a local folder or
  file relative to the catalog folder, or the hub only when the catalog says `from_hub`.
- What is read (`hf_input_files`): every file under a local folder, or the `data_files`;
  the stage cache fingerprints them, so a folder that grew is collected again.
- Before a parser sees them, JSON files are scanned for lines nested deeper than
  MAX_NESTING: pyarrow's JSON reader (the `json` builder's) overflows its stack on such a
  line (SIGSEGV at 100,000 levels, no message). A file holding one is left out of the load,
  and each of its records is rejected (the deep ones `nesting_too_deep`, the others
  `file_refused`), so the count still matches the file.
- Rows come through the Parquet reader's batch check (`parquet_reader.batch_records`):
  invalid UTF-8 and over-long cells are rejected row by row.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tasks.data.catalog import HfDatasetOptions, hf_data_files, hf_location
from tasks.data.input_files import compression_of
from tasks.data.parquet_reader import MAX_CELL_BYTES, batch_records
from tasks.data.readers import jsonl_lines
from tasks.data.rejection import Rejection

# `datasets` (seconds to import) is imported only when a source is an hf_dataset.

MAX_NESTING = 1000  # what Python's json parser handles (its recursion limit); pyarrow's crashes far deeper
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # a JSON string, escapes included
_JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
BATCH_ROWS = 1024


def hf_input_files(opts: HfDatasetOptions, root: Path) -> list[Path]:
    """Every local file an hf source reads, sorted: its data_files, or all files under its local folder."""
    if opts.data_files:
        return sorted(hf_data_files(opts, root))
    kind, where = hf_location(opts, root)
    if kind != "local":
        return []  # a hub dataset is pinned by its revision, which the source's definition holds
    where = Path(where)
    if where.is_file():
        return [where]
    found = []
    for folder, dirs, files in os.walk(where):  # not into linked folders: no loops
        dirs.sort()
        found += [Path(folder) / f for f in sorted(files)]
    return found


def _is_json(path: Path, opts: HfDatasetOptions) -> bool:
    name = path.name
    for suffix in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(suffix)
    return opts.name == "json" or name.endswith(_JSON_SUFFIXES)


def nesting_depth_over(raw: bytes, limit: int) -> bool:
    """Whether a JSON text nests deeper than `limit`, without parsing it (a parser is what
    would recurse): brackets counted outside strings, cheap counts first."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # most lines: cannot nest that deep
    bare = _STRING.sub(b"", raw)
    step = np.frombuffer(bare, dtype=np.uint8)
    depth = np.cumsum((step == ord("[")) | (step == ord("{")), dtype=np.int64) - np.cumsum(
        (step == ord("]")) | (step == ord("}")), dtype=np.int64)
    return bool(len(depth)) and int(depth.max()) > limit


_SCAN_LINE_BYTES = 256 << 20  # a longer line cannot be checked in bounded memory: its file is refused


def deep_lines(path: Path, limit: int | None = None) -> list[str]:
    """Locators of the lines of a JSON(L) file nested deeper than `limit` (default MAX_NESTING;
    or too long to check), streamed."""
    limit = MAX_NESTING if limit is None else limit
    return [loc for loc, raw in jsonl_lines(path, _SCAN_LINE_BYTES)
            if (isinstance(raw, Rejection) and raw.reason == "line_too_long") or (isinstance(raw, bytes) and nesting_depth_over(raw, limit))]


def refused_file_records(path: Path, deep: list[str], limit: int | None = None) -> Iterator[tuple[str, Rejection]]:
    """One rejection per record of a refused file: the deep lines and the others, which were not loaded."""
    limit = MAX_NESTING if limit is None else limit
    why = f"{path.name} {deep[0]} is nested deeper than {limit} levels (or too long to check)"
    marked = set(deep)
    for loc, _ in jsonl_lines(path, _SCAN_LINE_BYTES):
        if loc in marked:
            yield loc, Rejection("nesting_too_deep", f"nested deeper than {limit} levels (or over {_SCAN_LINE_BYTES} bytes); "
                                 "pyarrow's JSON reader would crash on it")
        else:
            yield loc, Rejection("file_refused", f"{why}, so the file was not given to the json builder; fix or remove that line")


def read_hf_rows(opts: HfDatasetOptions, root: Path, required: tuple[str, ...] = (),
                 max_cell_bytes: int = MAX_CELL_BYTES) -> Iterator[tuple[str, str, dict | Rejection]]:
    """Yield (path, locator, row | Rejection) for every record of an hf source."""
    label = f"hf:{opts.name}"
    files = hf_input_files(opts, root)
    json_files = [f for f in files if _is_json(f, opts) and compression_of(f) in (None, "gzip", "bz2", "xz", "zstd")]
    refused = {}
    for path in json_files:
        deep = deep_lines(path)
        if deep:
            refused[path] = deep
            for loc, rej in refused_file_records(path, deep):
                yield str(path), loc, rej
    keep = [f for f in files if f not in refused]
    if refused and not keep:
        return
    ds = load_hf(opts, root, keep if refused else None)
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        why = Rejection("missing_field", f"no column {missing[0]!r} (columns: {ds.column_names[:20]})")
        for i in range(ds.num_rows):
            yield label, f"row:{i}", why
        return
    row = 0
    for table in ds.with_format("arrow").iter(batch_size=BATCH_ROWS):
        for batch in table.combine_chunks().to_batches() or []:
            for loc, rec in batch_records(batch, None, row, max_cell_bytes):
                yield label, loc, rec
            row += batch.num_rows


def load_hf(opts: HfDatasetOptions, root: Path, only_files: list[Path] | None = None):
    """`datasets.load_dataset` for `opts`, local unless the catalog set `from_hub` (hf_location);
    `only_files` in place of the data files (those left after refusing some)."""
    import datasets

    kind, where = hf_location(opts, root)
    data_files = [str(p) for p in only_files] if only_files is not None else (
        [str(p) for p in hf_data_files(opts, root)] if opts.data_files else None)
    if kind == "local" and only_files is not None and not opts.data_files:
        # A folder: name its remaining files relative to it, so the builder it infers stays the same.
        data_files = [str(Path(p).relative_to(where)) for p in only_files]
    return datasets.load_dataset(str(where), opts.config, data_files=data_files, split=opts.split, revision=opts.revision)
