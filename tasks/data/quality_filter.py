"""Quality filter stage: each source's documents must pass its filter set's rules.

Kept documents go to `out_path`; removed ones go to `removed_path` with the failing
rule's name as `reason` and its measured value as `detail`. Large inputs are judged
in parallel worker processes, batch by batch, in order.
"""
from __future__ import annotations

import multiprocessing
import os
from collections import Counter, deque
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task

from tasks.data.documents import DOCUMENT_SCHEMA, REMOVED_SCHEMA, TableWriter, removed_from_documents
from tasks.data.quality_rules import FilterSpec, Verdict, judge_batch, validate_filter_spec
from tasks.data.step import StageResult, build_counts

STAGE = "quality"
BATCH_ROWS = 512
# Below this many documents, starting worker processes costs more than it saves.
PARALLEL_MIN_ROWS = 5_000


def _auto_workers(num_rows: int) -> int:
    if num_rows < PARALLEL_MIN_ROWS:
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def quality_filter(
    in_path: Path,
    out_path: Path,
    removed_path: Path,
    specs: dict[str, FilterSpec],
    workers: int | None = None,
) -> StageResult:
    """Filter documents by their source's FilterSpec (default FilterSpec() when a source has none).

    `workers` None picks one process for small inputs and up to 8 for large ones. Workers
    are spawned, so a script that calls this with more than one needs the usual
    `if __name__ == "__main__":` guard.
    """
    for source, spec in specs.items():
        validate_filter_spec(spec, f"filters of source '{source}'")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers})")
    pf = pq.ParquetFile(in_path)
    n_workers = workers or _auto_workers(pf.metadata.num_rows)
    inputs: Counter = Counter()
    kept: Counter = Counter()
    removed: dict[str, Counter] = {}
    per_rule: Counter = Counter()

    def write(batch: pa.RecordBatch, verdicts: list[Verdict], kept_w: TableWriter, rem_w: TableWriter) -> None:
        sources = batch.column("source").to_pylist()
        inputs.update(sources)
        keep = [v is None for v in verdicts]
        kept_w.write(batch.filter(pa.array(keep)))
        if all(keep):
            kept.update(sources)
            return
        gone = [v for v in verdicts if v is not None]
        for source, v in zip(sources, verdicts):
            if v is None:
                kept[source] += 1
            else:
                removed.setdefault(source, Counter())[v[0]] += 1
                per_rule[v[0]] += 1
        dropped = pa.Table.from_batches([batch.filter(pa.array([not k for k in keep]))])
        rem_w.write(removed_from_documents(dropped, STAGE, [g[0] for g in gone], [g[1] for g in gone]))

    batches = (b.cast(DOCUMENT_SCHEMA) for b in pf.iter_batches(batch_size=BATCH_ROWS, columns=DOCUMENT_SCHEMA.names))
    with TableWriter(out_path, DOCUMENT_SCHEMA) as kept_w, TableWriter(removed_path, REMOVED_SCHEMA) as rem_w:
        if n_workers == 1:
            for batch in batches:
                verdicts = judge_batch(specs, batch.column("source").to_pylist(), batch.column("text").to_pylist())
                write(batch, verdicts, kept_w, rem_w)
        else:
            # "spawn": the stage may run inside Prefect's worker threads, where forking is unsafe.
            ctx = multiprocessing.get_context("spawn")
            pending: deque[tuple[pa.RecordBatch, Future]] = deque()
            with ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
                for batch in batches:
                    fut = pool.submit(judge_batch, specs, batch.column("source").to_pylist(), batch.column("text").to_pylist())
                    pending.append((batch, fut))
                    # A bounded window keeps memory flat and the output in input order.
                    if len(pending) >= 2 * n_workers:
                        done_batch, done = pending.popleft()
                        write(done_batch, done.result(), kept_w, rem_w)
                while pending:
                    done_batch, done = pending.popleft()
                    write(done_batch, done.result(), kept_w, rem_w)

    result = StageResult(
        stage=STAGE,
        output=out_path,
        removed=removed_path,
        counts=build_counts(inputs, kept, removed),
        stats={f"removed:{rule}": n for rule, n in sorted(per_rule.items())} | {"workers": n_workers},
    )
    result.check_conservation()
    return result


quality_filter_task = task(quality_filter, name="quality")
