"""Collect: read every catalog source into the one document schema, with provenance.

Each record becomes either a document (stable id, source, licence, path, locator) or a
quarantined row with the reason it was rejected (malformed JSON, invalid UTF-8, missing
or non-string text field, empty text, binary file, over-long line, oversize file); the run goes on.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from pydoc_data import topics
from typing import Any

import pyarrow as pa

from infra.stages import Stage
from tasks.data import builtin_corpus
from tasks.data.catalog import Catalog, SourceConfig, source_files
from tasks.data.documents import Document, Removed, documents_table, iter_batches, make_doc_id, removed_table
from tasks.data.hf_source import hf_input_files, read_hf_rows
from tasks.data.parquet_reader import parquet_records
from tasks.data.readers import check_string, decode_utf8, jsonl_lines, parse_json_line, read_capped_file
from tasks.data.rejection import Rejection
from tasks.data.step import DataStep, StageResult

STAGE = "collect"
BATCH = 2048


def check_text(value: Any, field: str) -> str:
    """Return the value as document text, or raise Rejection saying what is wrong."""
    if value is None:
        raise Rejection("missing_field", f"no '{field}' field")
    return check_string(value, f"'{field}'")


def read_jsonl(path: Path, source: SourceConfig) -> Iterator[tuple[str, Any]]:
    """Yield (locator, text-or-Rejection) for each line of a JSONL(.gz) file."""
    for locator, raw in jsonl_lines(path, source.max_line_bytes, source.max_inflated_bytes):
        yield locator, raw if isinstance(raw, Rejection) else _json_text(raw, source)


def _json_text(raw: bytes, source: SourceConfig) -> Any:
    """A JSONL line's text or (id, text), or the Rejection saying why not."""
    obj, line = parse_json_line(raw)
    if isinstance(obj, Rejection):
        return obj
    if not isinstance(obj, dict):
        return Rejection("not_an_object", f"JSON {type(obj).__name__}, expected an object", text=line[:100_000])
    try:
        text = check_text(obj.get(source.text_field), source.text_field)
    except Rejection as rej:
        rej.text = rej.text or line[:100_000]
        return rej
    if source.id_field and source.id_field in obj:
        return (str(obj[source.id_field]), text)
    return text


def read_parquet(path: Path, source: SourceConfig) -> Iterator[tuple[str, Any]]:
    """(locator, text | (id, text) | Rejection) of every row; without the text column, every row is rejected."""
    records = parquet_records(path, [source.text_field, source.id_field or source.text_field], required=(source.text_field,),
                              max_cell_bytes=source.max_cell_bytes, max_row_group_bytes=source.max_row_group_bytes)
    yield from _column_texts(records, source)


def _column_texts(records: Iterable[tuple[str, dict]], source: SourceConfig) -> Iterator[tuple[str, Any]]:
    """(locator, text | (id, text) | Rejection) of tabular records (Parquet rows, dataset rows)."""
    for locator, rec in records:
        if isinstance(rec, Rejection):
            yield locator, rec
            continue
        try:
            text = check_text(rec.get(source.text_field), source.text_field)
            rid = rec.get(source.id_field) if source.id_field else None
            yield locator, ((str(rid), text) if rid is not None else text)
        except Rejection as rej:
            yield locator, rej


def read_text_file(path: Path, max_file_bytes: int) -> Any:
    raw = read_capped_file(path, max_file_bytes)
    if isinstance(raw, Rejection):
        return raw
    if b"\x00" in raw[:8192]:
        return Rejection("binary_file", "NUL byte in the first 8 KiB", raw=raw[:65536])
    try:
        return check_text(decode_utf8(raw), "file content")
    except Rejection as rej:
        return rej


def read_hf_dataset(catalog: Catalog, source: SourceConfig) -> Iterator[tuple[str, str, Any]]:
    """(path, locator, text | (id, text) | Rejection) of every record; without the text column, every row is rejected."""
    assert source.hf is not None
    rows = read_hf_rows(source.hf, catalog.root, (source.text_field,), source.max_cell_bytes)
    for path, locator, rec in rows:
        for _, out in _column_texts([(locator, rec)], source):
            yield path, locator, out


def iter_records(catalog: Catalog, source: SourceConfig, files: list[Path]) -> Iterator[tuple[str, str, Any]]:
    """Yield (path, locator, text | (id, text) | Rejection) for every record of a source."""
    if source.kind == "builtin":
        if source.builtin == "python_docs":
            for path, locator, text in builtin_corpus.python_docs():
                yield path, locator, text
        else:
            for path, locator, raw in builtin_corpus.python_stdlib():
                try:
                    yield path, locator, check_text(decode_utf8(raw), "file content")
                except Rejection as rej:
                    yield path, locator, rej
        return
    if source.kind == "hf_dataset":
        yield from read_hf_dataset(catalog, source)
        return
    for path in files:
        if source.kind == "jsonl":
            for locator, rec in read_jsonl(path, source):
                yield str(path), locator, rec
        elif source.kind == "parquet":
            for locator, rec in read_parquet(path, source):
                yield str(path), locator, rec
        elif source.kind == "text_dir":
            rel = path.relative_to(catalog.resolve(source))
            yield str(path), f"file:{rel}", read_text_file(path, source.max_file_bytes)


def source_inputs(catalog: Catalog, source: SourceConfig) -> list[Path]:
    """The files a source reads; the cache fingerprints them so edited data is re-collected."""
    if source.kind == "builtin":
        if source.builtin == "python_docs":
            return [Path(topics.__file__).resolve()]
        return builtin_corpus.stdlib_files()
    if source.kind == "hf_dataset":
        return hf_input_files(source.hf, catalog.root)  # every file under a local folder too, not only data_files
    return source_files(catalog, source)


def collect_source(
    catalog: Catalog, source: SourceConfig, out_dir: Path, input_files: list[Path] | None = None
) -> StageResult:
    """Read one source into `out_dir/<name>.parquet`; rejects into `<name>.removed.parquet`."""
    files = input_files if input_files is not None else source_inputs(catalog, source)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with DataStep(STAGE, out_dir / f"{source.name}.parquet", out_dir / f"{source.name}.removed.parquet") as step:
            n_in = _collect_records(step, catalog, source, files)
    except OSError as exc:
        # Still an OSError of the same errno subclass, so the task retries it, but naming the source.
        if exc.errno is None:  # e.g. pyarrow's I/O errors
            raise OSError(f"source '{source.name}': {exc}") from exc
        raise OSError(exc.errno, f"source '{source.name}': {exc.strerror or exc}", exc.filename) from exc
    step.read_count(source.name, n_in)
    return step.result({"warning": f"source '{source.name}' produced no records"} if n_in == 0 else {})


def _collect_records(step: DataStep, catalog: Catalog, source: SourceConfig, files: list[Path]) -> int:
    """Turn every record of `source` into a kept document or a quarantined row; return how many were read."""
    docs: list[Document] = []
    rejects: list[Removed] = []
    n_in = n_out = 0
    for path, locator, rec in iter_records(catalog, source, files):
        if source.max_documents is not None and n_out >= source.max_documents:
            break
        n_in += 1
        if isinstance(rec, tuple):
            rid, rec = rec
            locator = f"{locator}#id={rid}"
        doc_id = make_doc_id(source.name, path, locator)
        if isinstance(rec, Rejection):
            rejects.append(rec.removed(doc_id, source, path, locator, STAGE))
        else:
            n_out += 1
            docs.append(Document(doc_id, source.name, rec, source.licence, path, locator))
        if len(docs) >= BATCH:
            step.keep(documents_table(docs))
            docs.clear()
        if len(rejects) >= BATCH:
            step.remove(removed_table(rejects))
            rejects.clear()
    step.keep(documents_table(docs))
    step.remove(removed_table(rejects))
    return n_in


def merge_results(results: list[StageResult], out_path: Path, removed_path: Path, stage: str = STAGE) -> StageResult:
    """Concatenate per-source outputs (in catalog order) into one documents and one removed file."""
    with DataStep(stage, out_path, removed_path) as step:
        for r in results:
            for batch in iter_batches(r.output, batch_size=BATCH):
                step.keep(batch)
            if r.removed is not None:
                for batch in iter_batches(r.removed, batch_size=BATCH):
                    step.remove(pa.Table.from_batches([batch]))
    # Sources keep their catalog order (the funnel's order), not the step's sorted one.
    counts = {source: c for r in results for source, c in r.counts.items()}
    stats = {f"{k}:{src}": v for r in results for k, v in r.stats.items() for src in r.counts}
    result = StageResult(stage=stage, output=out_path, removed=removed_path, counts=counts, stats=stats, seconds=round(step.elapsed, 3))
    result.check_conservation()
    return result


def _retry_on_io_error(task_obj, task_run, state) -> bool:
    """Retry transient I/O errors only; bad data is quarantined and config errors fail at once."""
    try:
        state.result()
    except OSError:
        return True
    except Exception:
        return False
    return False


class Collect(Stage):
    """One source read into documents and quarantined rows: work/data/collect/<key>/<source>.parquet.

    Its config is the source's definition; its input, the source's files (by size and mtime). The
    catalog only locates and limits what is read, so it is not in the key. Transient I/O errors are
    retried with backoff; bad data is quarantined and config errors fail at once."""

    name, store, Config, Result = STAGE, "data/collect", SourceConfig, StageResult
    inputs = ("files",)
    run_name = "collect-{stage.config.name}"
    task_options = {"retries": 3, "retry_delay_seconds": [1, 2, 4], "retry_condition_fn": _retry_on_io_error}

    def __init__(self, source: SourceConfig, catalog: Catalog) -> None:
        super().__init__(source)
        self.catalog = catalog

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return collect_source(self.catalog, self.config, out_dir, inputs["files"])


class MergeCollected(Stage):
    """The sources' outputs (`parts`, catalog order) as one documents and one removed file: work/data/merge/<key>/."""

    name, store, Config, Result = "merge_collected", "data/merge", type(None), StageResult
    inputs = ("parts",)

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return merge_results(inputs["parts"], out_dir / "docs.parquet", out_dir / "removed.parquet")
