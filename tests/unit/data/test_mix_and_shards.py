"""Mix rebalancing hits target shares within the epoch caps; shards are atomic and verifiable."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.data.documents import Document, documents_table, write_table_atomic
from tasks.data.manifest import ChecksumError, load_manifest, shard_paths
from tasks.data.mix import MixConfig, plan_mix, rebalance_mix
from tasks.data.shards import ShardConfig, write_shards


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
    assert json.loads((out / "manifest.json").read_text())["shards"]
    # corruption is detected and names the file
    victim = shard_paths(manifest)[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ChecksumError, match=victim.name):
        shard_paths(manifest)
