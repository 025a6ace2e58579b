"""The code version of a stage: a hash of its module's source and of every project module it reaches.

A stage's cache key includes it, so an edited stage (or a helper it imports) reruns, and a
moved module, whose pickled Prefect results name the old path, never matches a stale record.
A launched stage's key also covers the module its ranks run (`LaunchedStage.rank_module`, infra/stages.py).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import threading
from pathlib import Path

# Packages whose source is the project's code (what a stage's code version covers).
PROJECT_PACKAGES = ("tasks", "models", "infra", "flows")


def _module_file(name: str) -> Path | None:
    """The source file of module `name`, found on disk without importing anything.

    `importlib.util.find_spec("a.b.c")` would import `a.b` (and all it imports: torch for
    models.calibration), which would load torch into the data flow's process for a hash; the path
    finder looks each part up in its parent package's folders instead.
    """
    top, *parts = name.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name is found, not imported
        for i in range(len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(".".join([top, *parts[: i + 1]]),
                                                            spec.submodule_search_locations)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


_PARSE_LOCK = threading.Lock()
_PARSE_TRIES = 3


def _parse(source: str) -> ast.AST:
    """`ast.parse`, one thread at a time, tried again on CPython 3.11's spurious "AST constructor recursion depth
    mismatch": the AST builder keeps its depth in state the interpreter's threads share, so a compile in another
    thread (an import, another task's parse) can trip the check (python/cpython#106905)."""
    with _PARSE_LOCK:
        for _ in range(_PARSE_TRIES - 1):
            try:
                return ast.parse(source)
            except SystemError as err:
                if "recursion depth mismatch" not in str(err):
                    raise
        return ast.parse(source)


def _project_imports(name: str, source: str, packages: tuple[str, ...]) -> set[str]:
    """Project modules that `name`'s source imports (at any depth in the file, lazy imports included)."""
    found: set[str] = set()
    package = name.rpartition(".")[0]
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            # `from tasks.data import builtin_corpus` imports a module, not a name.
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in packages and _module_file(m) is not None}


@functools.lru_cache(maxsize=None)
def code_version(module: str, packages: tuple[str, ...] = PROJECT_PACKAGES) -> str:
    """sha256 over the module's name and source and those of every project module it reaches."""
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        source = path.read_text(encoding="utf-8")
        seen[name] = hashlib.sha256(source.encode("utf-8")).hexdigest()
        todo.extend(_project_imports(name, source, packages) - seen.keys())
    return hashlib.sha256(json.dumps(sorted(seen.items())).encode()).hexdigest()
