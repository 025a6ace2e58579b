"""The one skeleton of a data stage, and what every data stage returns.

A stage says only what it decides: inside `with DataStep(...) as step:` it calls
`step.read(table)` for what it read, `step.keep(table)` for what it keeps and
`step.remove(removed_rows)` for what it drops (rows of REMOVED_SCHEMA, each with its
reason). The step writes the kept and removed Parquet files, counts per source and per
reason, times the stage, and `step.result(...)` returns the StageResult with
conservation checked (in == out + removed, for every source).
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field

from tasks.data.documents import DOCUMENT_SCHEMA, REMOVED_SCHEMA, TableWriter

# The counts every source has; any other key of StageResult.counts[source] is a removal reason.
IN, OUT = "in", "out"


class StageResult(BaseModel):
    """Summary of one data stage.

    counts[source] holds "in" (documents read), "out" (documents kept) and one entry
    per removal reason (a rule name, "exact_duplicate", "near_duplicate", ...), so that
    for every source: in == out + sum(reasons).
    """

    stage: str
    output: Path
    removed: Path | None = None
    counts: dict[str, dict[str, int]] = Field(default_factory=dict)
    stats: dict[str, float | int | str] = Field(default_factory=dict)
    report: dict[str, Any] = Field(default_factory=dict)  # structured stage report (e.g. the mix)
    seconds: float = 0.0  # wall time of the stage
    # The reason under which a dedup stage removes duplicates: the funnel gives it a column
    # of its own ("<reason>s"); every other reason of a dedup or filter stage is a filter.
    duplicate_reason: str | None = None

    def reasons(self, source: str) -> dict[str, int]:
        """Removal counts of `source` by reason."""
        return {k: v for k, v in self.counts.get(source, {}).items() if k not in (IN, OUT)}

    def removed_total(self, source: str) -> int:
        return sum(self.reasons(source).values())

    def check_conservation(self) -> None:
        """Raise if any document went missing or was counted twice in this stage."""
        for source, c in self.counts.items():
            check_conservation(f"stage {self.stage}: source {source}", c.get(IN, 0), [c.get(OUT, 0), self.removed_total(source)], c)


def check_conservation(what: str, n_in: int, ended: list[int], counts: dict[str, int]) -> None:
    """Raise naming `what` unless the `n_in` documents it read all ended in one of `ended`."""
    if n_in != sum(ended):
        raise AssertionError(f"{what}: {n_in} documents in but {sum(ended)} accounted for: {counts}")


def count_by_source(table: pa.Table | pa.RecordBatch) -> Counter:
    """Rows per source of a documents (or removed) table."""
    if table.num_rows == 0:
        return Counter()
    vc = pc.value_counts(table.column("source")).to_pylist()
    return Counter({d["values"]: d["counts"] for d in vc})


def count_removed(table: pa.Table) -> dict[str, Counter]:
    """Removed rows per source and reason."""
    out: dict[str, Counter] = defaultdict(Counter)
    for src, reason in zip(table.column("source").to_pylist(), table.column("reason").to_pylist()):
        out[src][reason] += 1
    return out


def build_counts(inputs: Counter, kept: Counter, removed: dict[str, Counter]) -> dict[str, dict[str, int]]:
    """Assemble StageResult.counts from per-source input, kept and removed counts."""
    counts: dict[str, dict[str, int]] = {}
    for source in sorted(set(inputs) | set(kept) | set(removed)):
        c = {IN: int(inputs.get(source, 0)), OUT: int(kept.get(source, 0))}
        c.update({k: int(v) for k, v in sorted(removed.get(source, Counter()).items())})
        counts[source] = c
    return counts


class DataStep:
    """One run of a data stage: kept and removed writers, per-source counts, timing.

    `removed_path` None: the stage removes nothing (it only rewrites documents).
    """

    def __init__(self, stage: str, out_path: Path, removed_path: Path | None = None, schema: pa.Schema = DOCUMENT_SCHEMA):
        self.stage = stage
        self.out_path = Path(out_path)
        self.removed_path = Path(removed_path) if removed_path is not None else None
        self.schema = schema
        self.inputs: Counter = Counter()
        self.kept: Counter = Counter()
        self.removed: dict[str, Counter] = defaultdict(Counter)
        self._started = time.perf_counter()
        self._seconds: float | None = None
        self._stack = ExitStack()

    def __enter__(self) -> "DataStep":
        self._started = time.perf_counter()
        self._kept_w = self._stack.enter_context(TableWriter(self.out_path, self.schema))
        if self.removed_path is not None:
            self._removed_w = self._stack.enter_context(TableWriter(self.removed_path, REMOVED_SCHEMA))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool | None:
        try:
            return self._stack.__exit__(exc_type, exc, tb)
        finally:
            self._seconds = time.perf_counter() - self._started

    @property
    def elapsed(self) -> float:
        """Wall seconds since the stage started (its total once the `with` block ended)."""
        return self._seconds if self._seconds is not None else time.perf_counter() - self._started

    def read(self, table: pa.Table | pa.RecordBatch) -> None:
        """Count the documents of `table` as read."""
        self.inputs.update(count_by_source(table))

    def read_count(self, source: str, n: int) -> None:
        """Count `n` records of `source` as read (a source of no records still gets a row)."""
        self.inputs[source] += n

    def keep(self, table: pa.Table | pa.RecordBatch, counted: pa.Table | None = None) -> None:
        """Write `table` to the kept file; count its rows as kept, or the rows of `counted`
        when the written rows are not one per document (the mix's repeats)."""
        self._kept_w.write(table)
        self.kept.update(count_by_source(counted if counted is not None else table))

    def remove(self, rows: pa.Table) -> None:
        """Write removed rows (REMOVED_SCHEMA) and count them per source and reason."""
        if rows.num_rows == 0:
            return
        self._removed_w.write(rows)
        for source, reasons in count_removed(rows).items():
            self.removed[source].update(reasons)

    def result(
        self, stats: dict[str, Any] | None = None, report: dict[str, Any] | None = None, duplicate_reason: str | None = None
    ) -> StageResult:
        """The StageResult of the finished stage, conservation checked."""
        result = StageResult(
            stage=self.stage,
            output=self.out_path,
            removed=self.removed_path,
            counts=build_counts(self.inputs, self.kept, self.removed),
            stats=stats or {},
            report=report or {},
            seconds=round(self.elapsed, 3),
            duplicate_reason=duplicate_reason,
        )
        result.check_conservation()
        return result
