"""Mix rebalancing hits target shares within the epoch caps; shards are atomic and verifiable."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.data.documents import Document, documents_table
from tasks.data.manifest import ChecksumError, load_manifest, shard_paths
from tasks.data.mix import MixConfig, rebalance_mix
from tasks.data.shards import ShardConfig, write_shards
from tests.helpers.mix import plan_mix
from tests.helpers.parquet import write_table_atomic


def test_plan_mix_downsamples_and_upsamples():
    sizes = {"small": np.full(10, 10), "big": np.full(40, 100)}  # 100 vs 4000 units
    repeats, report = plan_mix(sizes, {"small": 1, "big": 1}, {"small": 4, "big": 4}, seed=0)
    assert repeats["small"].sum() == 40  # 4 epochs: the cap binds
    assert report["sources"]["small"]["epochs"] == 4.0
    assert report["sources"]["big"]["achieved"] == pytest.approx(0.5, abs=0.02)
    assert (repeats["big"] == 0).sum() > 30  # most of the big source is down-sampled


def test_plan_mix_total_budget_and_determinism():
    rng = np.random.default_rng(1)
    sizes = {"a": rng.integers(50, 500, 300), "b": rng.integers(50, 500, 300), "c": rng.integers(50, 500, 50)}
    w = {"a": 0.6, "b": 0.3, "c": 0.1}
    r1, rep = plan_mix(sizes, w, {k: 10 for k in w}, seed=7, total=40_000)
    r2, _ = plan_mix(sizes, w, {k: 10 for k in w}, seed=7, total=40_000)
    assert all((r1[k] == r2[k]).all() for k in w)
    for k in w:
        assert rep["sources"][k]["achieved"] == pytest.approx(w[k], abs=0.02)
    total = sum(int((sizes[k] * r1[k]).sum()) for k in w)
    assert 40_000 <= total <= 40_000 + 3 * 500


def docs(source: str, n: int, length: int) -> list[Document]:
    return [Document(f"{source}-{i}", source, f"{source} {i} " + "w" * length, "MIT", "p", f"line:{i}") for i in range(n)]


def test_rebalance_mix_stage(tmp_path):
    inp = write_table_atomic(documents_table(docs("a", 20, 50) + docs("b", 200, 50)), tmp_path / "in.parquet")
    res = rebalance_mix(inp, tmp_path / "out.parquet", tmp_path / "rm.parquet", {"a": 0.5, "b": 0.5}, {"a": 3, "b": 3}, MixConfig())
    res.check_conservation()
    out = pq.read_table(tmp_path / "out.parquet")
    src = out.column("source").to_pylist()
    assert src.count("a") == 60 and abs(src.count("b") - 60) <= 1
    assert max(out.column("repeat").to_pylist()) == 2
    removed = pq.read_table(tmp_path / "rm.parquet")
    assert set(removed.column("reason").to_pylist()) == {"downsampled"}
    assert res.counts["b"]["out"] + res.counts["b"]["downsampled"] == 200


def test_mix_unknown_source_weight(tmp_path):
    inp = write_table_atomic(documents_table(docs("a", 2, 5)), tmp_path / "in.parquet")
    with pytest.raises(ValueError, match="no mix weight"):
        rebalance_mix(inp, tmp_path / "o.parquet", tmp_path / "r.parquet", {"b": 1.0}, {"b": 1}, MixConfig())


def test_shards_manifest_and_checksums(tmp_path):
    inp = write_table_atomic(documents_table(docs("a", 300, 2000)), tmp_path / "in.parquet")
    out = tmp_path / "shards"
    manifest = write_shards(inp, out, ShardConfig(shard_mb=0.2), {"a": {"collected": 300}}, {}, [])
    m = load_manifest(manifest)
    assert len(m.shards) >= 2 and sum(s.rows for s in m.shards) == 300
    paths = shard_paths(manifest)
    ids = [i for p in paths for i in pq.read_table(p).column("doc_id").to_pylist()]
    assert sorted(ids) == sorted(f"a-{i}" for i in range(300))
    # readable by pyarrow.dataset and datasets
    import datasets
    import pyarrow.dataset as ds

    assert ds.dataset(str(out), format="parquet", exclude_invalid_files=True).count_rows() == 300
    hf = datasets.load_dataset("parquet", data_files=[str(p) for p in paths], split="train")
    assert hf.num_rows == 300
    # a rerun replaces the folder whole; no temp folders are left behind
    write_shards(inp, out, ShardConfig(shard_mb=1.0), {}, {}, [])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # the modes mkdir and open give (umask 022 here: 755 and 644), not a temporary folder's 700 or file's 600
    from infra.workspace.atomic import DIR_MODE, FILE_MODE

    assert out.stat().st_mode & 0o777 == DIR_MODE and (out / "manifest.json").stat().st_mode & 0o777 == FILE_MODE
    assert json.loads((out / "manifest.json").read_text())["shards"]
    # corruption is detected and names the file
    victim = shard_paths(manifest)[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ChecksumError, match=victim.name):
        shard_paths(manifest)


def _varied(source: str, n: int, seed: int) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [Document(f"{source}-{i}", source, f"{source} {i} " + "w" * int(rng.integers(10, 400)), "MIT", "p", f"line:{i}")
            for i in range(n)]


def test_mix_streams_batches_deterministically_and_places_every_document_once(tmp_path):
    corpus = _varied("a", 300, 1) + _varied("b", 1500, 2) + _varied("c", 80, 3)
    inp = write_table_atomic(documents_table(corpus), tmp_path / "in.parquet")
    w, ep = {"a": 0.3, "b": 0.3, "c": 0.4}, {"a": 5, "b": 5, "c": 5}
    big = rebalance_mix(inp, tmp_path / "o1.parquet", tmp_path / "r1.parquet", w, ep, MixConfig(seed=3))
    small = rebalance_mix(inp, tmp_path / "o2.parquet", tmp_path / "r2.parquet", w, ep, MixConfig(seed=3), batch_rows=7)
    # The same rows whatever the batch size: the sample depends on (seed, source, doc_id) only.
    t1, t2 = pq.read_table(big.output), pq.read_table(small.output)
    assert t1.equals(t2)
    assert pq.read_table(big.removed).equals(pq.read_table(small.removed))
    assert big.report == small.report
    # Every document is kept (once with repeat 0) or removed as downsampled, never both.
    first = [d for d, r in zip(t1.column("doc_id").to_pylist(), t1.column("repeat").to_pylist()) if r == 0]
    removed = pq.read_table(big.removed).column("doc_id").to_pylist()
    assert len(first) == len(set(first)) and not set(first) & set(removed)
    assert sorted(first + removed) == sorted(d.doc_id for d in corpus)
    # Shares within tolerance of the targets; achieved units match what was written.
    for s, target in w.items():
        assert big.report["sources"][s]["achieved"] == pytest.approx(target, abs=0.01)
        written = sum(len(t) for t, src in zip(t1.column("text").to_pylist(), t1.column("source").to_pylist()) if src == s)
        assert written == big.report["sources"][s]["sampled"]
    # Another seed samples other documents.
    other = rebalance_mix(inp, tmp_path / "o3.parquet", tmp_path / "r3.parquet", w, ep, MixConfig(seed=4))
    assert set(pq.read_table(other.removed).column("doc_id").to_pylist()) != set(removed)


def test_plan_mix_overshoot_is_under_one_hash_bucket():
    rng = np.random.default_rng(5)
    sizes = {"a": rng.integers(1, 1000, 200_000), "b": rng.integers(1, 1000, 20_000)}
    repeats, report = plan_mix(sizes, {"a": 0.5, "b": 0.5}, {"a": 10, "b": 10}, seed=0, total=1_000_000)
    for s in sizes:
        sampled = int((sizes[s] * repeats[s]).sum())
        assert sampled == report["sources"][s]["sampled"]
        # wanted 500,000 units; a hash bucket of "a" holds ~200,000 * 500 / 65,536 ~ 1,500 units
        assert 500_000 <= sampled <= 500_000 + 4 * int(sizes[s].sum()) // 65_536 + 1000


def _mixed_rows(tmp_path, n: int) -> tuple[object, list[tuple[str, int]]]:
    table = documents_table(_varied("a", n, 7) + _varied("b", n // 2, 8))
    reps = [i % 3 for i in range(table.num_rows)]
    import pyarrow as pa

    table = table.append_column("repeat", pa.array(reps, pa.int32()))
    path = write_table_atomic(table, tmp_path / "mixed.parquet")
    return path, sorted(zip(table.column("doc_id").to_pylist(), reps))


def test_shards_shuffle_through_several_buckets_deterministically(tmp_path):
    from tasks.data import shards as shards_mod

    inp, rows = _mixed_rows(tmp_path, 3000)
    cfg = ShardConfig(shard_mb=0.05, bucket_mb=0.1, seed=2)
    assert shards_mod._n_buckets(pq.ParquetFile(inp), cfg) >= 4  # the shuffle really goes through buckets
    m1 = write_shards(inp, tmp_path / "s1", cfg, {}, {}, [])
    m2 = write_shards(inp, tmp_path / "s2", cfg, {}, {}, [], batch_rows=111)
    sums1 = [s.sha256 for s in load_manifest(m1).shards]
    assert len(sums1) >= 3 and sums1 == [s.sha256 for s in load_manifest(m2).shards]  # byte-identical, any batch size
    tables = [pq.read_table(p) for p in shard_paths(m1)]
    got = [(d, r) for t in tables for d, r in zip(t.column("doc_id").to_pylist(), t.column("repeat").to_pylist())]
    assert sorted(got) == rows  # every row exactly once
    assert got != [(d, r) for d, r in zip(pq.read_table(inp).column("doc_id").to_pylist(), pq.read_table(inp).column("repeat").to_pylist())]
    assert all(t.column("text").nbytes <= 0.05 * (1 << 20) + 1000 for t in tables)
    assert load_manifest(m1).stats["rows"] == len(rows)
    # Another seed, another order; no bucket files are left behind.
    m3 = write_shards(inp, tmp_path / "s3", ShardConfig(shard_mb=0.05, bucket_mb=0.1, seed=3), {}, {}, [])
    assert [s.sha256 for s in load_manifest(m3).shards] != sums1
    assert not list(tmp_path.rglob("*.arrow"))


def test_shards_without_shuffle_keep_input_order_and_max_rows(tmp_path):
    inp, rows = _mixed_rows(tmp_path, 500)
    m = write_shards(inp, tmp_path / "s", ShardConfig(shuffle=False, max_rows=100), {}, {}, [])
    shards = load_manifest(m).shards
    assert [s.rows for s in shards] == [100] * 7 + [50]
    ids = [d for p in shard_paths(m) for d in pq.read_table(p).column("doc_id").to_pylist()]
    assert ids == pq.read_table(inp).column("doc_id").to_pylist()
