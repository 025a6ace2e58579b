"""infra/atomic.py: what a reader sees of an atomic write, and the mode it leaves."""
from __future__ import annotations

import os
import stat

import pytest

from infra.atomic import FILE_MODE, UMASK, atomic_write, write_json_atomic, write_text_atomic


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
