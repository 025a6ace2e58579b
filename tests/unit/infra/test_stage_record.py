"""Completion records: a folder verifies until a file changes, goes missing or is truncated;
a downstream key follows the recorded content, not where the workspace lives or its mtimes."""
from __future__ import annotations

import shutil

import pytest

from infra.workspace.cache import path_fingerprint
from infra.workspace.record import RECORD_FILE, read_record, verify_record, write_record


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "work" / "data" / "near" / "abc"
    (out / "sub").mkdir(parents=True)
    (out / "docs.parquet").write_bytes(b"x" * 1000)
    (out / "sub" / "removed.parquet").write_bytes(b"y" * 10)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "big.pt").write_bytes(b"z")  # checkpoints carry their own sums
    (out / ".docs.parquet.123.tmp").write_bytes(b"partial")  # a staging file is never recorded
    write_record(out, "k" * 64, "near_dedup")
    return out


def test_record_lists_outputs_but_not_checkpoints_or_staging(folder):
    files = read_record(folder)["files"]
    assert sorted(files) == ["docs.parquet", "sub/removed.parquet"]
    assert verify_record(folder) is None


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damage_is_named(folder, damage):
    path = folder / "docs.parquet"
    if damage == "flip":
        path.write_bytes(b"x" * 999 + b"X")
    elif damage == "truncate":
        path.write_bytes(b"x" * 10)
    else:
        path.unlink()
    problem = verify_record(folder)
    assert problem is not None and "docs.parquet" in problem


def test_a_folder_without_record_is_incomplete(folder):
    (folder / RECORD_FILE).unlink()
    assert "no readable" in verify_record(folder)


def test_fingerprint_follows_content_not_location_or_mtime(folder, tmp_path):
    before = path_fingerprint(folder / "docs.parquet")
    moved = tmp_path / "elsewhere" / "abc"
    shutil.copytree(folder, moved)  # new mtimes, new absolute path
    assert path_fingerprint(moved / "docs.parquet") == before
    (moved / "docs.parquet").write_bytes(b"other")
    write_record(moved, "k" * 64, "near_dedup")
    assert path_fingerprint(moved / "docs.parquet") != before
