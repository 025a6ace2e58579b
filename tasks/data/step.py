"""What every data stage returns: paths and counts, never document lists."""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field


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

    def removed_total(self, source: str) -> int:
        return sum(v for k, v in self.counts.get(source, {}).items() if k not in ("in", "out"))

    def check_conservation(self) -> None:
        """Raise if any document went missing or was counted twice in this stage."""
        for source, c in self.counts.items():
            if c.get("in", 0) != c.get("out", 0) + self.removed_total(source):
                raise AssertionError(f"stage {self.stage}: source {source} does not conserve documents: {c}")


def count_by_source(table: pa.Table) -> Counter:
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
        c = {"in": int(inputs.get(source, 0)), "out": int(kept.get(source, 0))}
        c.update({k: int(v) for k, v in sorted(removed.get(source, Counter()).items())})
        counts[source] = c
    return counts
