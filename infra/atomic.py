"""The one way to write a file atomically: write a temporary sibling, fsync, rename.

Readers (and a rerun after a crash) see either the old file or the complete new one,
never a partial file; a failed write leaves no temporary file behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_path(final: Path) -> Path:
    """A temporary sibling path; rename it to `final` once complete so readers never see a partial file."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    return Path(tmp)


def commit_atomic(tmp: Path, final: Path) -> None:
    """fsync `tmp` and rename it onto `final`."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)


@contextlib.contextmanager
def atomic_write(final: Path | str) -> Iterator[Path]:
    """`with atomic_write(path) as tmp:` write to `tmp`; on success it becomes `path`, on error it is removed."""
    final = Path(final)
    tmp = atomic_path(final)
    try:
        yield tmp
        commit_atomic(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path | str, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: Path | str, obj: Any) -> Path:
    """Write `obj` as indented JSON (a pydantic model as its JSON dump) to `path` atomically."""
    if hasattr(obj, "model_dump_json"):
        text = obj.model_dump_json(indent=2)
    else:
        text = json.dumps(obj, indent=2, ensure_ascii=False)
    return write_text_atomic(path, text + "\n")
