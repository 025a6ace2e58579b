"""Write the mixed documents as Parquet shards (zstd) with a manifest.

The shard folder is built under a temporary name and swapped into place in one rename,
so readers see either the previous complete set or the new one, never a partial shard;
`manifest.json` (per-shard rows, bytes, sha256, the funnel and the mix) is written last.
"""
from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task
from pydantic import Field

from infra.config import StrictModel
from tasks.data.manifest import Manifest, ShardInfo, sha256_file, write_manifest

MANIFEST = "manifest.json"


class ShardConfig(StrictModel):
    shard_mb: float = Field(default=64.0, gt=0)  # target uncompressed text per shard
    max_rows: int | None = Field(default=None, gt=0)
    shuffle: bool = True
    seed: int = 0
    compression: str = "zstd"


def _shard_bounds(text_bytes: np.ndarray, cfg: ShardConfig) -> list[tuple[int, int]]:
    limit = int(cfg.shard_mb * (1 << 20))
    bounds, start, acc = [], 0, 0
    for i, b in enumerate(text_bytes.tolist()):
        full = acc + b > limit or (cfg.max_rows is not None and i - start >= cfg.max_rows)
        if full and i > start:
            bounds.append((start, i))
            start, acc = i, 0
        acc += b
    if start < len(text_bytes):
        bounds.append((start, len(text_bytes)))
    return bounds


def write_shards(
    mixed_path: Path,
    out_dir: Path,
    cfg: ShardConfig,
    funnel: dict[str, dict[str, int]],
    mix_report: dict[str, Any],
    removed_files: list[Path],
    config_hash: str = "",
) -> Path:
    """Shard `mixed_path` into `out_dir` and return the manifest's path."""
    table = pq.read_table(mixed_path, memory_map=True)
    if cfg.shuffle and table.num_rows:
        order = np.random.default_rng(cfg.seed).permutation(table.num_rows)
        table = table.take(pa.array(order, pa.int64()))
    sizes = pa.compute.binary_length(table.column("text").cast(pa.binary())).to_numpy(zero_copy_only=False)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # A writer killed earlier leaves its hidden staging folder behind; it was never visible.
    for stale in out_dir.parent.glob(f".{out_dir.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        shards = []
        for k, (a, b) in enumerate(_shard_bounds(sizes, cfg)):
            part = table.slice(a, b - a)
            path = staging / f"shard-{k:05d}.parquet"
            pq.write_table(part, path, compression=cfg.compression)
            src = Counter(part.column("source").to_pylist())
            shards.append(
                ShardInfo(file=path.name, rows=part.num_rows, bytes=path.stat().st_size, sha256=sha256_file(path), sources=dict(src))
            )
        manifest = Manifest(
            config_hash=config_hash,
            shards=shards,
            funnel=funnel,
            mix=mix_report,
            removed_files=[str(Path(p).resolve()) for p in removed_files],
            stats={"rows": table.num_rows, "text_bytes": int(sizes.sum())},
        )
        write_manifest(manifest, staging / MANIFEST)
        _swap_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / MANIFEST


def _swap_into_place(staging: Path, final: Path) -> None:
    """Replace `final` by `staging` with renames only (a crash leaves one complete copy)."""
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(final)


write_shards_task = task(write_shards, name="write-shards")
