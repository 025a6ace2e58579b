"""One catalog source collected in a temporary folder: files written for it, its kept and removed rows read back."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source


def write(p: Path, data: bytes | str) -> Path:
    """`data` written to `p` (text as UTF-8), its folders made."""
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def collect_one(tmp_path: Path, yaml: str):
    """The source `yaml` describes (tmp_path/cat/src.yaml) collected: (result, kept rows, removed rows), conserved."""
    write(tmp_path / "cat" / "src.yaml", yaml)
    cat = load_catalog(tmp_path / "cat", data_roots=[tmp_path])
    res = collect_source(cat, cat.sources[0], tmp_path / "out")
    kept = pq.read_table(res.output).to_pylist()
    removed = pq.read_table(res.removed).to_pylist()
    res.check_conservation()
    return res, kept, removed
