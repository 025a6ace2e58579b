"""The house's layering, read from the code's own imports (every import, inside functions too):
no module imports another that imports it back, no folder imports one above it, and infra/ names no module above it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("infra", "models", "tasks", "flows")
# Bottom to top: a folder imports only folders before it (and itself). tasks/ is ordered by part.
LAYERS = ("infra", "models", "tasks/data", "tasks/tokenizer", "tasks/eval", "tasks/training", "tasks/reports", "flows")
# Inside infra/ and tasks/training/, the same for their sub-folders and modules, bottom to top.
INFRA = ("infra/config.py", "infra/machine.py", "infra/workspace", "infra/tracking", "infra/lifecycle", "infra/launch",
         "infra/stages.py")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """{module: the project modules it imports}, a `from pkg import name` of a submodule counted as that submodule."""
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module(p) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}
        graph[_module(path)] = {m for m in found if m in modules and m != _module(path)}
    return graph


def _folder(module: str, layers: tuple[str, ...]) -> int | None:
    path = module.replace(".", "/")
    for i, layer in enumerate(layers):
        if path == layer.removesuffix(".py") or path.startswith(layer.removesuffix(".py") + "/"):
            return i
    return None


def test_no_module_imports_one_that_imports_it_back():
    graph = _imports()
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("layers", [LAYERS, INFRA], ids=["folders", "infra"])
def test_no_folder_imports_one_above_it(layers):
    upward = []
    for module, imported in _imports().items():
        here = _folder(module, layers)
        for other in imported:
            there = _folder(other, layers)
            if here is not None and there is not None and there > here:
                upward.append(f"{module} -> {other}")
    assert not upward, f"imports from a lower folder to a higher one: {sorted(upward)}"


def test_infra_names_no_module_above_it_even_as_a_string():
    """A string such as "tasks.training.rank" in infra/ code is an upward dependency the imports do not show: a
    stage declares its rank module instead (LaunchedStage.rank_module). Docstrings and comments may name examples."""
    offenders = []
    for path in sorted((ROOT / "infra").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if any(node.value.startswith(f"{pkg}.") or node.value.startswith(f"{pkg}/") for pkg in ("tasks", "flows")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not offenders, offenders


def test_infra_has_at_most_eight_modules_at_its_top_level():
    top = [p.name for p in (ROOT / "infra").iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()]
    assert len(top) <= 8, sorted(top)
    for package in (ROOT / "infra").iterdir():
        if (package / "__init__.py").is_file():
            doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
            assert doc and len(doc.splitlines()) == 1, f"{package.name}/__init__.py needs a one-line docstring"
