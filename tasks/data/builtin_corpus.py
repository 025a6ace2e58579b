"""The built-in default corpus, present on every Python install and needing no network.

* `python_docs`: prose from Python's own documentation (`pydoc_data.topics`), one
  document per topic.
* `python_stdlib`: code, the standard library's `.py` files (tests, IDLE and vendored
  packages left out). It holds real near-duplicates, e.g. the `encodings/cp*.py`
  codec tables, which the near-dedup stage must find.
"""
from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path
from pydoc_data import topics

_SKIP_PARTS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}


def python_docs() -> Iterator[tuple[str, str, str]]:
    """Yield (path, locator, text) for each documentation topic."""
    path = str(Path(topics.__file__).resolve())
    for name in sorted(topics.topics):
        yield path, f"topic:{name}", topics.topics[name]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_files() -> list[Path]:
    root = stdlib_root()
    return sorted(p for p in root.rglob("*.py") if not (_SKIP_PARTS & set(p.relative_to(root).parts)))


def python_stdlib() -> Iterator[tuple[str, str, bytes]]:
    """Yield (path, locator, raw bytes) for each standard-library module."""
    root = stdlib_root()
    for p in stdlib_files():
        yield str(p), f"file:{p.relative_to(root)}", p.read_bytes()
