"""infra/workspace/atomic.py: what a reader sees of an atomic write, and the mode it leaves."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from infra.workspace.atomic import FILE_MODE, UMASK, atomic_write, write_json_atomic, write_text_atomic


def test_written_files_have_the_mode_open_gives_not_mkstemps(tmp_path):
    assert FILE_MODE == 0o666 & ~UMASK and UMASK == os.umask(UMASK)  # read without changing it
    text = write_text_atomic(tmp_path / "a.txt", "hello\n")
    data = write_json_atomic(tmp_path / "sub" / "b.json", {"x": 1})
    plain = tmp_path / "plain.txt"
    plain.write_text("hello\n")
    for path in (text, data):
        assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == FILE_MODE


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_text_atomic(tmp_path / "a.txt", "old\n")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk on fire")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_staging_folder_gets_mkdirs_mode_and_keeps_a_shared_groups_setgid(tmp_path):
    import tempfile

    from infra.workspace.atomic import DIR_MODE, open_folder_mode

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)  # a group's folder: what is made in it inherits the group, and folders the setgid bit
    made = shared / "plain"
    made.mkdir()
    staging = Path(tempfile.mkdtemp(dir=shared))
    assert stat.S_IMODE(staging.stat().st_mode) & 0o777 == 0o700
    open_folder_mode(staging)
    assert stat.S_IMODE(staging.stat().st_mode) == stat.S_IMODE(made.stat().st_mode) == DIR_MODE | stat.S_ISGID
