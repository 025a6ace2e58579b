"""The one way to write a file atomically: write a temporary sibling, fsync, rename.

Readers (and a rerun after a crash) see either the old file or the complete new one,
never a partial file; a failed write leaves no temporary file behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _read_umask() -> int:
    """The process's umask. Setting it is the only portable way to read it, so this is done once, at import, before
    a flow starts threads (a thread creating a file meanwhile would get the wrong mode)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()
FILE_MODE = 0o666 & ~UMASK  # what open() gives a new file; mkstemp's own is 0600
DIR_MODE = 0o777 & ~UMASK  # what mkdir() gives a new folder; mkdtemp's own is 0700


def atomic_path(final: Path) -> Path:
    """A temporary sibling path; rename it to `final` once complete so readers never see a partial file. It has the
    mode a plain open() would give `final`, so other users of a shared workspace can read what a run wrote."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    # A file system without modes (vfat, some network mounts) refuses: its own are what open() gives.
    with contextlib.suppress(OSError):
        os.fchmod(fd, FILE_MODE)
    os.close(fd)
    return Path(tmp)


def open_file_mode(path: Path) -> None:
    """Give a file a library wrote private (safetensors: 0600) the mode open() gives: FILE_MODE. Best effort."""
    with contextlib.suppress(OSError):
        if path.is_file():
            path.chmod(FILE_MODE)


def open_folder_mode(path: Path) -> None:
    """Give a folder made by mkdtemp (0700) the mode mkdir() would have: DIR_MODE, keeping a setgid bit it inherited
    from a shared group's folder (files made in it then keep that group). Best effort, as atomic_path."""
    with contextlib.suppress(OSError):
        path.chmod(DIR_MODE | (path.stat().st_mode & stat.S_ISGID))


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


def write_figure_atomic(figure: Any, path: Path | str) -> Path:
    """A matplotlib Figure as a PNG at `path`, written atomically (a reader never sees half a PNG). The figure needs
    no pyplot state or display: savefig renders it with the Agg canvas."""
    with atomic_write(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return Path(path)
