"""The documents name only modules and folders that exist (ARCHITECTURE.md's every path, in code blocks too), and
the architecture's layering holds: infra/ and models/ import nothing from tasks/ or flows/."""
from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import ROOT

# The documents that say what is true now (docs/experiments/ are dated logs: the paths they name were true then).
DOCS = ["README.md", "ARCHITECTURE.md", "RELIABILITY.md", "BENCHMARKS.md",
        *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
# `tasks/data/step.py`, `infra/launch/deepspeed/`, `tasks.training.pretrain.worker`
_PATH = re.compile(r"`((?:tasks|flows|infra|models|bench|tests|data_catalog)/[\w./*-]*)")
_MODULE = re.compile(r"\b((?:tasks|flows|infra|models)(?:\.\w+)+)\b")


def _exists(ref: str) -> bool:
    ref = ref.rstrip("/.")
    if "*" in ref or "<" in ref:
        return bool(list(ROOT.glob(ref)))
    return (ROOT / ref).exists() or (ROOT / f"{ref}.py").exists()


@pytest.mark.parametrize("doc", DOCS)
def test_paths_named_in_docs_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    missing = sorted({p for p in _PATH.findall(text) if not _exists(p)})
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_modules_named_in_docs_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    missing = set()
    for mod in set(_MODULE.findall(text)):
        parts = mod.split(".")
        # `tasks.training.<stage>.worker` and attribute suffixes: the longest existing prefix must be a module
        for n in range(len(parts), 1, -1):
            if _exists("/".join(parts[:n])):
                break
        else:
            missing.add(mod)
    assert not missing, f"{doc} names modules that do not exist: {sorted(missing)}"


def test_architecture_lists_every_tasks_package():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in (ROOT / "tasks").iterdir() if (p / "__init__.py").is_file())
    assert packages == ["data", "eval", "reports", "tokenizer", "training"]
    for name in packages:
        assert f"{name}/" in text, f"ARCHITECTURE.md does not describe tasks/{name}/"


def test_at_most_eight_modules_directly_in_tasks():
    assert len(list((ROOT / "tasks").glob("*.py"))) <= 8


@pytest.mark.parametrize("layer", ["infra", "models"])
def test_lower_layers_import_nothing_from_tasks_or_flows(layer):
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("tasks", "flows")]
    assert not offenders, offenders


def test_every_path_architecture_names_exists():
    """Its hop-by-hop path from `llmforge run` to engine.backward and its layer picture name files in code blocks."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:tasks|flows|infra|models|bench|tests)/[\w/]*[\w]+(?:\.py|/))", text))
    assert len(named) > 40  # the picture, the table and the path: the test sees them
    missing = sorted(p for p in named if not _exists(p))
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"
