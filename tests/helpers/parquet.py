"""Parquet input files for the data stages' tests, written whole and atomically."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from infra.workspace.atomic import atomic_write


def write_table_atomic(table: pa.Table, final: Path, compression: str = "zstd") -> Path:
    """Write a Parquet file under a temporary name, fsync, then rename into place."""
    with atomic_write(final) as tmp:
        pq.write_table(table, tmp, compression=compression)
    return Path(final)
