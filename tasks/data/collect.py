"""Collect: read every catalog source into the one document schema, with provenance.

Each record becomes either a document (stable id, source, licence, path, locator) or a
quarantined row with the reason it was rejected (malformed JSON, invalid UTF-8, missing
or non-string text field, empty text, binary file, over-long line); the run goes on.
"""
from __future__ import annotations

import glob as globlib
import gzip
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect import task

from tasks.data import builtin_corpus
from tasks.data.catalog import Catalog, SourceConfig, source_files
from tasks.data.documents import (
    DOCUMENT_SCHEMA,
    REMOVED_SCHEMA,
    Document,
    Removed,
    TableWriter,
    documents_table,
    make_doc_id,
    removed_table,
)
from tasks.data.step import StageResult, build_counts

STAGE = "collect"
BATCH = 2048


class Rejection(Exception):
    """A record that cannot become a document; `reason` is a short machine-readable name."""

    def __init__(self, reason: str, detail: str = "", raw: bytes | None = None, text: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.raw, self.text = reason, detail, raw, text


def check_text(value: Any, field: str) -> str:
    """Return the value as document text, or raise Rejection saying what is wrong."""
    if value is None:
        raise Rejection("missing_field", f"no '{field}' field")
    if not isinstance(value, str):
        raise Rejection("wrong_type", f"'{field}' is {type(value).__name__}, expected a string", text=repr(value)[:1000])
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates from JSON escapes
        raise Rejection("invalid_unicode", str(exc), text=value.encode("utf-8", "replace").decode()) from None
    if not value.strip():
        raise Rejection("empty_text", f"'{field}' is empty or whitespace")
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


def read_jsonl(path: Path, source: SourceConfig) -> Iterator[tuple[str, Any]]:
    """Yield (locator, text-or-Rejection) for each line of a JSONL(.gz) file."""
    with _open_lines(path) as fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline(source.max_line_bytes + 1)
            except (EOFError, gzip.BadGzipFile, OSError) as exc:
                yield f"line:{lineno + 1}", Rejection("corrupt_file", f"{type(exc).__name__}: {exc}")
                return
            if not raw:
                return
            lineno += 1
            locator = f"line:{lineno}"
            if len(raw) > source.max_line_bytes:
                # Skip the rest of the over-long line without holding it in memory.
                size = len(raw)
                while raw and not raw.endswith(b"\n"):
                    raw = fh.readline(1 << 20)
                    size += len(raw)
                yield locator, Rejection("line_too_long", f"{size} bytes > max_line_bytes={source.max_line_bytes}")
                continue
            if not raw.strip():
                continue  # blank lines are layout, not records
            yield locator, _parse_json_record(raw, source)


def _parse_json_record(raw: bytes, source: SourceConfig) -> Any:
    try:
        line = decode_utf8(raw)
    except Rejection as rej:
        return rej
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        return Rejection("malformed_json", str(exc)[:200], raw=raw, text=line[:100_000])
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
    pf = pq.ParquetFile(path)
    if source.text_field not in pf.schema_arrow.names:
        yield "file", Rejection("missing_field", f"no column '{source.text_field}' (columns: {pf.schema_arrow.names})")
        return
    columns = [source.text_field] + ([source.id_field] if source.id_field and source.id_field in pf.schema_arrow.names else [])
    row = 0
    for batch in pf.iter_batches(batch_size=BATCH, columns=columns):
        texts = batch.column(0).to_pylist()
        ids = batch.column(1).to_pylist() if batch.num_columns > 1 else [None] * len(texts)
        for value, rid in zip(texts, ids):
            locator = f"row:{row}"
            row += 1
            try:
                text = check_text(value, source.text_field)
                yield locator, ((str(rid), text) if rid is not None else text)
            except Rejection as rej:
                yield locator, rej


def read_text_file(path: Path) -> Any:
    raw = path.read_bytes()
    if b"\x00" in raw[:8192]:
        return Rejection("binary_file", "NUL byte in the first 8 KiB", raw=raw[:65536])
    try:
        return check_text(decode_utf8(raw), "file content")
    except Rejection as rej:
        return rej


def read_hf_dataset(catalog: Catalog, source: SourceConfig) -> Iterator[tuple[str, Any]]:
    import datasets

    opts = source.hf
    assert opts is not None
    data_files = opts.data_files
    if data_files is not None:
        files = [data_files] if isinstance(data_files, str) else data_files
        data_files = [str((catalog.root / f).resolve()) for f in files]
    ds = datasets.load_dataset(opts.name, opts.config, data_files=data_files, split=opts.split, revision=opts.revision)
    if source.text_field not in ds.column_names:
        yield "dataset", Rejection("missing_field", f"no column '{source.text_field}' (columns: {ds.column_names})")
        return
    for i, rec in enumerate(ds):
        try:
            text = check_text(rec.get(source.text_field), source.text_field)
            rid = rec.get(source.id_field) if source.id_field else None
            yield f"row:{i}", ((str(rid), text) if rid is not None else text)
        except Rejection as rej:
            yield f"row:{i}", rej


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
        for locator, rec in read_hf_dataset(catalog, source):
            yield f"hf:{source.hf.name}", locator, rec
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
            yield str(path), f"file:{rel}", read_text_file(path)


def source_inputs(catalog: Catalog, source: SourceConfig) -> list[Path]:
    """The files a source reads; the cache fingerprints them so edited data is re-collected."""
    if source.kind == "builtin":
        if source.builtin == "python_docs":
            from pydoc_data import topics

            return [Path(topics.__file__).resolve()]
        return builtin_corpus.stdlib_files()
    if source.kind == "hf_dataset":
        files = source.hf.data_files if source.hf else None
        if not files:
            return []
        files = [files] if isinstance(files, str) else files
        return sorted(Path(p) for f in files for p in globlib.glob(str((catalog.root / f).resolve()), recursive=True))
    return source_files(catalog, source)


def collect_source(
    catalog: Catalog, source: SourceConfig, out_dir: Path, input_files: list[Path] | None = None
) -> StageResult:
    """Read one source into `out_dir/<name>.parquet`; rejects into `<name>.removed.parquet`."""
    files = input_files if input_files is not None else source_inputs(catalog, source)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{source.name}.parquet"
    removed_path = out_dir / f"{source.name}.removed.parquet"
    docs: list[Document] = []
    rejects: list[Removed] = []
    reasons: Counter = Counter()
    n_in = n_out = 0
    try:
        with TableWriter(out_path, DOCUMENT_SCHEMA) as kept_w, TableWriter(removed_path, REMOVED_SCHEMA) as rej_w:
            for path, locator, rec in iter_records(catalog, source, files):
                if source.max_documents is not None and n_out >= source.max_documents:
                    break
                n_in += 1
                if isinstance(rec, tuple):
                    rid, rec = rec
                    locator = f"{locator}#id={rid}"
                doc_id = make_doc_id(source.name, path, locator)
                if isinstance(rec, Rejection):
                    reasons[rec.reason] += 1
                    rejects.append(
                        Removed(
                            doc_id=doc_id, source=source.name, text=rec.text or "", stage=STAGE, reason=rec.reason,
                            licence=source.licence, path=path, locator=locator, detail=rec.detail[:1000], raw=rec.raw,
                        )
                    )
                else:
                    n_out += 1
                    docs.append(Document(doc_id, source.name, rec, source.licence, path, locator))
                if len(docs) >= BATCH:
                    kept_w.write(documents_table(docs))
                    docs.clear()
                if len(rejects) >= BATCH:
                    rej_w.write(removed_table(rejects))
                    rejects.clear()
            kept_w.write(documents_table(docs))
            rej_w.write(removed_table(rejects))
    except OSError as exc:
        # Still an OSError of the same errno subclass, so the task retries it, but naming the source.
        if exc.errno is None:  # e.g. pyarrow's I/O errors
            raise OSError(f"source '{source.name}': {exc}") from exc
        raise OSError(exc.errno, f"source '{source.name}': {exc.strerror or exc}", exc.filename) from exc
    stats: dict[str, float | int | str] = {}
    if n_in == 0:
        stats["warning"] = f"source '{source.name}' produced no records"
    result = StageResult(
        stage=STAGE,
        output=out_path,
        removed=removed_path,
        counts=build_counts(Counter({source.name: n_in}), Counter({source.name: n_out}), {source.name: reasons}),
        stats=stats,
    )
    result.check_conservation()
    return result


def merge_results(results: list[StageResult], out_path: Path, removed_path: Path, stage: str = STAGE) -> StageResult:
    """Concatenate per-source outputs (in catalog order) into one documents and one removed file."""
    counts: dict[str, dict[str, int]] = {}
    stats: dict[str, float | int | str] = {}
    with TableWriter(out_path, DOCUMENT_SCHEMA) as kept_w, TableWriter(removed_path, REMOVED_SCHEMA) as rej_w:
        for r in results:
            for batch in pq.ParquetFile(r.output).iter_batches(batch_size=BATCH):
                kept_w.write(batch)
            if r.removed is not None:
                for batch in pq.ParquetFile(r.removed).iter_batches(batch_size=BATCH):
                    rej_w.write(batch)
            counts.update(r.counts)
            stats.update({f"{k}:{src}": v for k, v in r.stats.items() for src in r.counts})
    return StageResult(stage=stage, output=out_path, removed=removed_path, counts=counts, stats=stats)


def _retry_on_io_error(task_obj, task_run, state) -> bool:
    """Retry transient I/O errors only; bad data is quarantined and config errors fail at once."""
    try:
        state.result()
    except OSError:
        return True
    except Exception:
        return False
    return False


collect_source_task = task(
    collect_source,
    name="collect",
    task_run_name="collect-{source.name}",
    retries=3,
    retry_delay_seconds=[1, 2, 4],
    retry_condition_fn=_retry_on_io_error,
)
merge_collected_task = task(merge_results, name="merge-collected")
