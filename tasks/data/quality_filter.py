"""Quality filter stage: each source's documents must pass its filter set's rules.

Kept documents go to `out_path`; removed ones go to `removed_path` with the failing
rule's name as `reason` and its measured value as `detail`. A source whose filters rewrite
pages (C4 as published, `c4_mode: lines`) keeps the new text in `out_path` and the original
in `rewritten.parquet` beside `removed_path` (reason "rewritten", the characters each line
rule deleted as detail), so nothing read is lost. Large inputs are judged by workers,
batch by batch, in order (tasks/data/parallel.py chooses how many from measured cost).
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.stages import Stage
from tasks.data.documents import (DOCUMENT_SCHEMA, REMOVED_SCHEMA, TableWriter, iter_batches, removed_from_documents,
                                  text_byte_slices)
from tasks.data.parallel import ordered_map, plan_workers
from tasks.data.quality_rules import FilterSpec, Judgement, judge_batch, validate_filter_spec
from tasks.data.step import DataStep, StageResult

STAGE = "quality"
BATCH_ROWS = 512
# Text bytes per job at most: the rules' word and n-gram arrays cost ~65 bytes per byte of
# text, so 512 KiB bounds a job (and a worker) at ~35 MB whatever the documents' lengths,
# and is still enough text that a job's fixed costs stay small beside its work.
JOB_TEXT_BYTES = 512 * 1024
MAX_AUTO_WORKERS = 8
REWRITTEN = "rewritten"  # reason of an original page in rewritten.parquet (not a removal)


def quality_filter(
    in_path: Path,
    out_path: Path,
    removed_path: Path,
    specs: dict[str, FilterSpec],
    workers: int | None = None,
) -> StageResult:
    """Filter documents by their source's FilterSpec (default FilterSpec() when a source has none).

    `workers` None chooses from measured cost, up to 8 (see tasks/data/parallel.py, also for
    the `__main__` guard spawned workers need).
    """
    for source, spec in specs.items():
        validate_filter_spec(spec, f"filters of source '{source}'")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers})")
    pf = pq.ParquetFile(in_path)
    n_rows = pf.metadata.num_rows
    batches = (whole.cast(DOCUMENT_SCHEMA).slice(i, j - i)
               for whole in iter_batches(pf, BATCH_ROWS, columns=DOCUMENT_SCHEMA.names)
               for i, j in text_byte_slices(whole.column("text"), JOB_TEXT_BYTES))
    jobs = ((b, (specs, b.column("source").to_pylist(), b.column("text").to_pylist())) for b in batches)
    chars: dict[str, int] = {}
    originals_path = Path(removed_path).with_name("rewritten.parquet")
    with DataStep(STAGE, out_path, removed_path) as step, TableWriter(originals_path, REMOVED_SCHEMA) as originals:
        mapped = ordered_map(judge_batch, jobs, plan_workers(n_rows, BATCH_ROWS, workers or 0, max_workers=MAX_AUTO_WORKERS),
                             n_jobs=_n_jobs(pf), max_workers=MAX_AUTO_WORKERS, label=STAGE)
        for batch, judgement in mapped:
            _write_judgement(step, originals, batch, judgement, chars)
    per_rule: dict[str, int] = {}
    for reasons in step.removed.values():
        for rule, n in reasons.items():
            per_rule[rule] = per_rule.get(rule, 0) + n
    stats: dict[str, int | str] = {f"removed:{rule}": n for rule, n in sorted(per_rule.items())}
    stats |= dict(sorted(chars.items())) | {"rewritten": originals.rows}
    return step.result(stats | {"workers": mapped.plan.workers, "worker_plan": mapped.plan.describe()})


def _n_jobs(pf: pq.ParquetFile) -> int:
    """About how many jobs the file makes (the worker plan weighs the work left): by rows, or by
    the text column's uncompressed bytes where documents are long."""
    meta = pf.metadata
    text_bytes = sum(col.total_uncompressed_size for g in range(meta.num_row_groups)
                     for col in (meta.row_group(g).column(i) for i in range(meta.num_columns)) if col.path_in_schema == "text")
    return max(-(-meta.num_rows // BATCH_ROWS), -(-text_bytes // JOB_TEXT_BYTES))


def _write_judgement(step: DataStep, originals: TableWriter, batch: pa.RecordBatch, judgement: Judgement,
                     chars: dict[str, int]) -> None:
    """Keep the documents that passed (with their new text where a rule rewrote them); remove the
    others with the failing rule and its detail; keep each rewritten page's original."""
    step.read(batch)
    verdicts = judgement.verdicts
    keep = pa.array([v is None for v in verdicts])
    kept = batch.filter(keep)
    if judgement.rewritten:
        texts = batch.column("text").to_pylist()
        for i, new in judgement.rewritten.items():
            texts[i] = new
        kept = batch.set_column(batch.schema.get_field_index("text"), "text", pa.array(texts, pa.string())).filter(keep)
        rows = sorted(judgement.rewritten)
        before = pa.Table.from_batches([batch]).take(pa.array(rows))
        details = [json.dumps(judgement.chars_removed.get(i, {}), sort_keys=True) for i in rows]
        originals.write(removed_from_documents(before, STAGE, [REWRITTEN] * len(rows), details))
        sources = batch.column("source").to_pylist()
        for i in rows:
            for why, n in judgement.chars_removed.get(i, {}).items():
                key = f"chars_removed:c4_lines_{why}:{sources[i]}"
                chars[key] = chars.get(key, 0) + n
    step.keep(kept)
    gone = [v for v in verdicts if v is not None]
    if gone:
        dropped = pa.Table.from_batches([batch.filter(pc.invert(keep))])
        step.remove(removed_from_documents(dropped, STAGE, [g[0] for g in gone], [g[1] for g in gone]))


class QualityFilter(Stage):
    """The catalog's quality rules (config: rule specs by source): work/data/quality/<key>/{docs,removed}.parquet."""

    name, store, Config, Result = STAGE, "data/quality", dict, StageResult
    inputs = ("docs",)

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return quality_filter(inputs["docs"], out_dir / "docs.parquet", out_dir / "removed.parquet", self.config)
