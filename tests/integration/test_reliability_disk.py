"""Unwritable workspace and full disk: a clear error before work, and no partial output left readable."""
from __future__ import annotations

import errno
import os

import pytest

from flows.cli import main
from infra.workspace.paths import Workspace
from tasks.data.manifest import load_manifest, shard_paths
from tasks.data.shards import ShardConfig, write_shards
from tests.helpers.corpora import mixed_documents
from tests.helpers.mounts import mounts  # noqa: F401 - the tmpfs fixture


def test_file_where_the_workspace_folder_should_be(tmp_path):
    blocker = tmp_path / "work"
    blocker.write_text("not a folder")
    for root in (blocker, blocker / "nested"):
        with pytest.raises(PermissionError, match=rf"workspace {root} is not writable .*--workdir or LLMFORGE_HOME"):
            Workspace(root).ensure_writable()


def test_write_probe_hitting_enospc_is_reported(tmp_path):
    """The kernel's /dev/full answers every write with ENOSPC: the probe reports it, naming the folder."""
    root = tmp_path / "work"
    root.mkdir()
    (root / ".write-probe").symlink_to("/dev/full")
    with pytest.raises(PermissionError, match=r"not writable \(No space left on device\)"):
        Workspace(root).ensure_writable()


def test_read_only_mount_fails_before_any_work(mounts, tmp_path, monkeypatch, capsys):  # noqa: F811
    ro = mounts("ro", "ro,size=1m")
    with pytest.raises(PermissionError, match="Read-only file system"):
        Workspace(ro / "work").ensure_writable()
    # The CLI stops before the data flow (and Prefect's start-up) with the same message.
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                "PREFECT_SERVER_ANALYTICS_ENABLED"):
        monkeypatch.delenv(key, raising=False)
    assert main(["data", "--workdir", str(ro / "work")]) == 3
    assert "Read-only file system" in capsys.readouterr().err
    assert not list(ro.iterdir())


def test_full_disk_while_sharding_keeps_previous_set(mounts, tmp_path):  # noqa: F811
    small = mounts("small", "size=1m")
    out = small / "shards"
    previous = write_shards(mixed_documents(tmp_path / "old.parquet", 50, "old"), out, ShardConfig(shard_mb=0.01), {}, {}, [])
    before = [s.sha256 for s in load_manifest(previous).shards]
    big = mixed_documents(tmp_path / "big.parquet", 20_000, "new")  # ~8 MB of text: cannot fit in 1 MiB
    with pytest.raises(OSError) as info:
        write_shards(big, out, ShardConfig(shard_mb=0.05), {}, {}, [])
    assert info.value.errno == errno.ENOSPC or "No space left" in str(info.value)
    assert [s.sha256 for s in load_manifest(out).shards] == before
    shard_paths(out)  # still verifies
    assert sorted(p.name for p in small.iterdir()) == ["shards"]  # the staging folder was removed
    free = os.statvfs(small)
    assert free.f_bavail > 0  # the space the failed attempt used was given back
