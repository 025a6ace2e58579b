"""The tests' own layout: shared helpers live in tests/helpers/, no test module imports another (tests/helpers/ and
conftest.py are the exceptions), and the order table (tests/helpers/schedule.py) names tests that exist."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from tests.conftest import ROOT
from tests.helpers.schedule import COST

TESTS = ROOT / "tests"
HELPERS = "tests.helpers"


def module_of(path: Path) -> str:
    """`path`'s dotted module name from the repository root (a package's __init__.py: the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for each module that `source`, the module `module`, imports: `from P import n` is P.n where
    that is a module, else P; relative imports resolved; importlib.import_module("...") and __import__("...") too."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            parent = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                child = f"{parent}.{alias.name}"
                found.append((node.lineno, child if is_module(child) else parent))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return sorted(set(found))


def allowed(target: str) -> bool:
    """Outside tests/, or a shared helper, or a conftest."""
    parts = target.split(".")
    return parts[0] != "tests" or target == HELPERS or target.startswith(HELPERS + ".") or parts[-1] == "conftest"


def offenders(source: str, module: str, is_package: bool = False) -> list[str]:
    return [f"line {line}: {target}" for line, target in imports(source, module, is_package) if not allowed(target)]


def test_the_check_sees_every_form_of_import():
    source = textwrap.dedent("""
        import tests.unit.data.test_collect
        from tests.unit.data.test_collect import BAD_JSONL
        from tests.unit.data import test_collect
        from .test_collect import BAD_JSONL
        from . import test_collect
        from ..eval.test_abstention import ABSTENTION
        from tests.unit import data
        from tests.conftest import ROOT
        from tests.helpers.collect import write
        from tests.helpers import collect
        from tasks.data.collect import collect_source
        import importlib
        importlib.import_module("tests.unit.data.test_collect")
        importlib.import_module("tests.helpers.collect")
    """)
    assert offenders(source, "tests.unit.data.test_honest_inputs") == [
        "line 2: tests.unit.data.test_collect",
        "line 3: tests.unit.data.test_collect",
        "line 4: tests.unit.data.test_collect",
        "line 5: tests.unit.data.test_collect",
        "line 6: tests.unit.data.test_collect",
        "line 7: tests.unit.eval.test_abstention",
        "line 8: tests.unit.data",
        "line 14: tests.unit.data.test_collect",
    ]
    assert offenders("from .shared import shared_once\n", "tests.helpers", is_package=True) == []


def test_no_test_module_imports_another():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        source, package = path.read_text(encoding="utf-8"), path.name == "__init__.py"
        found += [f"{path.relative_to(ROOT)}: {o}" for o in offenders(source, module_of(path), package)]
    assert not found, "import shared helpers from tests/helpers/ or a conftest:\n" + "\n".join(found)


def test_shared_helpers_live_in_tests_helpers():
    helpers = TESTS / "helpers"
    strays = [str(p.relative_to(ROOT)) for p in sorted(TESTS.rglob("*.py")) if helpers not in p.parents
              and not p.name.startswith("test_") and p.name not in ("conftest.py", "__init__.py")]
    assert not strays, f"move these to tests/helpers/: {strays}"


def test_the_order_table_names_tests_that_exist():
    missing = []
    for key in COST:
        file, _, test = key.partition("::")
        path = ROOT / file
        if not path.is_file():
            missing.append(key)
        elif test:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            if test.split("[")[0] not in defined:
                missing.append(key)
    assert not missing, f"tests/helpers/schedule.py's COST names tests that do not exist: {missing}"
