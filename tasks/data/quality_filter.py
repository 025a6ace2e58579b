"""Quality filter stage: each source's documents must pass its filter set's rules.

Kept documents go to `out_path`; removed ones go to `removed_path` with the failing
rule's name as `reason` and its measured value as `detail`. Large inputs are judged
in parallel worker processes, batch by batch, in order.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task

from tasks.data.documents import DOCUMENT_SCHEMA, removed_from_documents
from tasks.data.parallel import ordered_map, plan_workers
from tasks.data.quality_rules import FilterSpec, Verdict, judge_batch, validate_filter_spec
from tasks.data.step import DataStep, StageResult

STAGE = "quality"
BATCH_ROWS = 512
# Below this many documents, starting worker processes costs more than it saves.
PARALLEL_MIN_ROWS = 5_000
MAX_AUTO_WORKERS = 8


def quality_filter(
    in_path: Path,
    out_path: Path,
    removed_path: Path,
    specs: dict[str, FilterSpec],
    workers: int | None = None,
) -> StageResult:
    """Filter documents by their source's FilterSpec (default FilterSpec() when a source has none).

    `workers` None picks one process for small inputs and up to 8 for large ones (see
    tasks/data/parallel.py, also for the `__main__` guard spawned workers need).
    """
    for source, spec in specs.items():
        validate_filter_spec(spec, f"filters of source '{source}'")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers})")
    pf = pq.ParquetFile(in_path)
    n_workers = workers or plan_workers(
        pf.metadata.num_rows, BATCH_ROWS, parallel_from=PARALLEL_MIN_ROWS, max_workers=MAX_AUTO_WORKERS
    )
    batches = (b.cast(DOCUMENT_SCHEMA) for b in pf.iter_batches(batch_size=BATCH_ROWS, columns=DOCUMENT_SCHEMA.names))
    jobs = ((b, (specs, b.column("source").to_pylist(), b.column("text").to_pylist())) for b in batches)
    with DataStep(STAGE, out_path, removed_path) as step:
        for batch, verdicts in ordered_map(judge_batch, jobs, n_workers):
            _write_verdicts(step, batch, verdicts)
    per_rule: dict[str, int] = {}
    for reasons in step.removed.values():
        for rule, n in reasons.items():
            per_rule[rule] = per_rule.get(rule, 0) + n
    return step.result({f"removed:{rule}": n for rule, n in sorted(per_rule.items())} | {"workers": n_workers})


def _write_verdicts(step: DataStep, batch: pa.RecordBatch, verdicts: list[Verdict]) -> None:
    """Keep the documents that passed; remove the others with the failing rule and its detail."""
    step.read(batch)
    keep = [v is None for v in verdicts]
    step.keep(batch.filter(pa.array(keep)))
    gone = [v for v in verdicts if v is not None]
    if gone:
        dropped = pa.Table.from_batches([batch.filter(pa.array([not k for k in keep]))])
        step.remove(removed_from_documents(dropped, STAGE, [g[0] for g in gone], [g[1] for g in gone]))


quality_filter_task = task(quality_filter, name="quality")
