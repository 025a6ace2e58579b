"""A shard writer killed mid-write (SIGKILL) never leaves readers a partial shard set; a rerun matches."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.data.manifest import load_manifest, shard_paths
from tasks.data.shards import MANIFEST, ShardConfig, write_shards
from tests.conftest import ROOT
from tests.helpers.corpora import mixed_documents

CFG = ShardConfig(shard_mb=0.02, seed=1)  # ~20 KB per shard: hundreds of shards, a few seconds of writing

_WRITER = """
import sys
from pathlib import Path
from tasks.data.shards import ShardConfig, write_shards
write_shards(Path(sys.argv[1]), Path(sys.argv[2]), ShardConfig.model_validate_json(sys.argv[3]), {}, {}, [])
"""


def _sums(manifest: Path) -> list[str]:
    return [s.sha256 for s in load_manifest(manifest).shards]


def _kill_when(staging_parent: Path, name: str, min_files: int, args: list[str]) -> int:
    """Start the writer, SIGKILL it once its staging folder holds min_files shards; return how many it held."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            staged = [p for p in staging_parent.glob(f".{name}.*") if p.is_dir() and not p.name.endswith(".old")]
            n = sum(len(list(p.glob("shard-*.parquet"))) for p in staged)
            if n >= min_files:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return n
            if proc.poll() is not None:
                pytest.fail(f"writer finished (rc={proc.returncode}) before {min_files} shards were staged; use more input")
            time.sleep(0.005)
        pytest.fail("the writer staged no shards within 60 s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return -1


@pytest.mark.slow
def test_sigkill_mid_write_keeps_previous_set_and_rerun_matches(tmp_path):
    mixed = mixed_documents(tmp_path / "mixed.parquet", 20_000, "new")  # ~8 MB of text, ~400 shards
    reference = write_shards(mixed, tmp_path / "ref" / "shards", CFG, {}, {}, [])
    n_shards = len(load_manifest(reference).shards)
    assert n_shards > 100

    out = tmp_path / "run" / "shards"
    previous = write_shards(mixed_documents(tmp_path / "old.parquet", 500, "old"), out, CFG, {}, {}, [])
    previous_sums = _sums(previous)

    killed_at = []
    for min_files in (1, n_shards // 2):  # early, and half-way through the shard set
        killed_at.append(_kill_when(out.parent, "shards", min_files, [str(mixed), str(out), CFG.model_dump_json()]))
        # Readers see the previous complete set: same manifest, every shard verifies, nothing extra.
        assert _sums(out / MANIFEST) == previous_sums
        shard_paths(out / MANIFEST)
        assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST] + [s.file for s in load_manifest(out).shards])

    rerun = write_shards(mixed, out, CFG, {}, {}, [])
    assert _sums(rerun) == _sums(reference)  # same shard bytes as an uninterrupted run
    shard_paths(rerun)
    print(f"killed after {killed_at} of {n_shards} shards were staged")


def test_kill_with_no_previous_set_leaves_no_final_folder(tmp_path):
    mixed = mixed_documents(tmp_path / "mixed.parquet", 6_000, "x")
    out = tmp_path / "run" / "shards"
    _kill_when(out.parent, "shards", 5, [str(mixed), str(out), CFG.model_dump_json()])
    assert not out.exists()  # no half-written folder under the final name
    with pytest.raises(FileNotFoundError, match="run the data flow"):
        load_manifest(out)
    rerun = write_shards(mixed, out, CFG, {}, {}, [])
    assert len(shard_paths(rerun)) == len(load_manifest(rerun).shards) > 5
