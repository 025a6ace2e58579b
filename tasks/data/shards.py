"""Write the mixed documents as Parquet shards (zstd) with a manifest.

The shard folder is built under a temporary name and swapped into place in one rename,
so readers see either the previous complete set or the new one, never a partial shard;
`manifest.json` (per-shard rows, bytes, sha256, the funnel and the mix) is written last.

The shuffle holds one bucket, not the corpus: pass 1 sends each row to one of B temporary
bucket files by a seeded hash of (doc_id, repeat), B chosen so a bucket holds about
`bucket_mb` of text; pass 2 loads one bucket at a time, permutes it with an RNG seeded by
(seed, bucket) and streams its rows into shards cut at `shard_mb` / `max_rows`. A row's
bucket and its place in the bucket depend only on the input rows and the config, not on
batch sizes, so a rerun writes byte-identical shards.
"""
from __future__ import annotations

import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash
from pydantic import Field

from infra.config import StrictModel
from infra.stages import Stage
from infra.workspace.atomic import open_folder_mode
from infra.workspace.record import sha256_file
from tasks.data.documents import iter_batches
from tasks.data.manifest import Manifest, ShardInfo, write_manifest

MANIFEST = "manifest.json"
BATCH_ROWS = 4096
# Pass 1 keeps one open file per bucket; the cap stays well under the usual 1024 descriptors.
MAX_BUCKETS = 512
# Text per row group of a shard: what the shard writer holds at a time.
ROW_GROUP_BYTES = 8 << 20
_BUCKETS_DIR = "buckets.tmp"  # inside the staging folder, removed before the swap


class ShardConfig(StrictModel):
    shard_mb: float = Field(default=64.0, gt=0)  # target uncompressed text per shard
    max_rows: int | None = Field(default=None, gt=0)
    shuffle: bool = True
    seed: int = 0
    compression: str = "zstd"
    # Shuffle memory: about this much uncompressed data per bucket is held at a time
    # (more on corpora over MAX_BUCKETS x bucket_mb, where the bucket count is capped). A
    # bucket is held twice (read, then permuted), so 16 MB keeps pass 2 near 100 MB; larger
    # buckets make the stage's memory grow with the corpus for no faster run
    # (docs/experiments/2026-12-04-data-stages-memory.md).
    bucket_mb: float = Field(default=16.0, gt=0)


def _text_bytes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    return pc.binary_length(table.column("text").cast(pa.binary())).to_numpy(zero_copy_only=False).astype(np.int64)


def _bucket_of_rows(batch: pa.RecordBatch, seed: int, n_buckets: int) -> np.ndarray:
    """Seeded bucket of each row, from (doc_id, repeat): the copies of a document spread apart."""
    ids = batch.column("doc_id").to_pylist()
    reps = batch.column("repeat").to_pylist() if "repeat" in batch.schema.names else [0] * len(ids)
    prefix = f"{seed}\x1f"
    h = np.fromiter((xxhash.xxh3_64_intdigest(f"{prefix}{d}\x1f{r}") for d, r in zip(ids, reps)), dtype=np.uint64, count=len(ids))
    return (h % np.uint64(n_buckets)).astype(np.int64)


def _n_buckets(pf: pq.ParquetFile, cfg: ShardConfig) -> int:
    """Buckets so that each holds about `bucket_mb` of (uncompressed) data."""
    md = pf.metadata
    data_bytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return min(MAX_BUCKETS, max(1, math.ceil(data_bytes / (cfg.bucket_mb * (1 << 20)))))


def _bucket_files(pf: pq.ParquetFile, cfg: ShardConfig, folder: Path, batch_rows: int) -> list[Path]:
    """Pass 1: split the rows into seeded buckets (Arrow IPC files, in input order within each)."""
    n = _n_buckets(pf, cfg)
    folder.mkdir()
    paths = [folder / f"bucket-{b:05d}.arrow" for b in range(n)]
    schema = pf.schema_arrow
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    writers = [pa.ipc.new_file(p, schema, options=options) for p in paths]
    try:
        for batch in iter_batches(pf, batch_rows):
            buckets = _bucket_of_rows(batch, cfg.seed, n)
            order = np.argsort(buckets, kind="stable")
            bounds = np.searchsorted(buckets[order], np.arange(n + 1))
            sorted_batch = batch.take(pa.array(order))
            for b in np.flatnonzero(np.diff(bounds)).tolist():
                writers[b].write_batch(sorted_batch.slice(bounds[b], bounds[b + 1] - bounds[b]))
    finally:
        for w in writers:
            w.close()
    return paths


def _shuffled_rows(pf: pq.ParquetFile, cfg: ShardConfig, folder: Path, batch_rows: int) -> Iterator[pa.Table]:
    """The rows in shuffled order (or input order without shuffle), a table at a time."""
    if not cfg.shuffle:
        for batch in iter_batches(pf, batch_rows):
            yield pa.Table.from_batches([batch])
        return
    for b, path in enumerate(_bucket_files(pf, cfg, folder, batch_rows)):
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        path.unlink()
        if table.num_rows:
            rng = np.random.default_rng([cfg.seed, b])
            yield table.take(pa.array(rng.permutation(table.num_rows)))
        del table


class _ShardWriter:
    """Cuts a stream of rows into shards of at most `shard_mb` of text / `max_rows` rows.

    A shard is written as it fills, a row group of about ROW_GROUP_BYTES of text at a time, so
    the writer holds one row group, not the shard. Cuts depend only on the rows, so a rerun
    writes the same bytes.
    """

    def __init__(self, staging: Path, cfg: ShardConfig):
        self.staging, self.cfg = staging, cfg
        self.limit = int(cfg.shard_mb * (1 << 20))
        self.group_limit = min(self.limit, ROW_GROUP_BYTES)
        self.parts: list[pa.Table] = []  # rows of the row group being filled
        self.rows = self.acc = 0  # of the shard being filled
        self.group_acc = 0
        self.shards: list[ShardInfo] = []
        self.total_rows = self.total_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self._path = staging
        self._shard_rows = 0
        self._sources: Counter = Counter()

    def add(self, table: pa.Table) -> None:
        sizes = _text_bytes(table)
        self.total_rows += table.num_rows
        self.total_bytes += int(sizes.sum())
        start = 0
        for i, b in enumerate(sizes.tolist()):
            full = self.acc + b > self.limit or (self.cfg.max_rows is not None and self.rows >= self.cfg.max_rows)
            if full and self.rows:
                self.parts.append(table.slice(start, i - start))
                self.flush()
                start = i
            elif self.group_acc + b > self.group_limit and (self.parts or i > start):
                self.parts.append(table.slice(start, i - start))
                self._write_group()
                start = i
            self.acc += b
            self.group_acc += b
            self.rows += 1
        self.parts.append(table.slice(start))

    def _write_group(self) -> None:
        """Write the buffered rows as one row group of the open shard."""
        group = pa.concat_tables(self.parts).combine_chunks() if self.parts else None
        self.parts, self.group_acc = [], 0
        if group is None or not group.num_rows:
            return
        if self._writer is None:
            self._path = self.staging / f"shard-{len(self.shards):05d}.parquet"
            self._writer = pq.ParquetWriter(self._path, group.schema, compression=self.cfg.compression)
        self._writer.write_table(group, row_group_size=group.num_rows)
        self._shard_rows += group.num_rows
        self._sources.update({d["values"]: d["counts"] for d in pc.value_counts(group.column("source")).to_pylist()})

    def flush(self) -> None:
        """Finish the open shard."""
        self._write_group()
        self.rows = self.acc = 0
        if self._writer is None:
            return
        self._writer.close()
        path = self._path
        self.shards.append(ShardInfo(file=path.name, rows=self._shard_rows, bytes=path.stat().st_size,
                                     sha256=sha256_file(path), sources=dict(sorted(self._sources.items()))))
        self._writer, self._shard_rows, self._sources = None, 0, Counter()


def write_shards(
    mixed_path: Path,
    out_dir: Path,
    cfg: ShardConfig,
    funnel: dict[str, dict[str, int]],
    mix_report: dict[str, Any],
    removed_files: list[Path],
    config_hash: str = "",
    batch_rows: int = BATCH_ROWS,
    decontamination: dict[str, Any] | None = None,
) -> Path:
    """Shard `mixed_path` into `out_dir` and return the manifest's path."""
    pf = pq.ParquetFile(mixed_path)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # A writer killed earlier leaves its hidden staging folder behind; it was never visible.
    for stale in out_dir.parent.glob(f".{out_dir.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    open_folder_mode(staging)  # the final folder's mode, as mkdir would give it, not mkdtemp's 0700
    try:
        writer = _ShardWriter(staging, cfg)
        for table in _shuffled_rows(pf, cfg, staging / _BUCKETS_DIR, batch_rows):
            writer.add(table)
        writer.flush()
        shutil.rmtree(staging / _BUCKETS_DIR, ignore_errors=True)
        manifest = Manifest(
            config_hash=config_hash,
            shards=writer.shards,
            funnel=funnel,
            mix=mix_report,
            decontamination=decontamination or {},
            removed_files=[str(Path(p).resolve()) for p in removed_files],
            stats={"rows": writer.total_rows, "text_bytes": writer.total_bytes},
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


class WriteShards(Stage):
    """Shuffled Parquet shards and their manifest (with the funnel, the mix and where removed rows went):
    work/data/shards/<key>/manifest.json; the manifest's path."""

    name, store, Config, Result = "write_shards", "data/shards", ShardConfig, Path
    inputs = ("docs", "funnel", "mix_report", "removed_files", "config_hash", "decontamination")

    def compute(self, inputs: dict, out_dir: Path) -> Path:
        return write_shards(inputs["docs"], out_dir, self.config, inputs["funnel"], inputs["mix_report"],
                            inputs["removed_files"], inputs["config_hash"],
                            decontamination=inputs["decontamination"])
