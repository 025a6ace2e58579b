"""The stage cache key follows the stage's code: an edited stage (or what it imports) gets a new
key, an unrelated module does not."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from infra.workspace.code_version import code_version

PKG = "cachekeypkg"


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / PKG
    root.mkdir()
    (root / "__init__.py").write_text("")
    files = {
        "stage.py": """
            from cachekeypkg.helper import double
            def run(x):
                return double(x)
        """,
        "helper.py": "def double(x):\n    return 2 * x\n",
        "unrelated.py": "VALUE = 1\n",
    }
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m.split(".")[0] == PKG]:
        del sys.modules[name]


def _key() -> str:
    code_version.cache_clear()
    return code_version(f"{PKG}.stage", packages=(PKG,))


@pytest.mark.parametrize("edited", ["stage.py", "helper.py"])
def test_editing_the_stage_or_what_it_reaches_changes_the_key(package: Path, edited: str):
    before = _key()
    with (package / edited).open("a") as fh:
        fh.write("\n# edited\nEXTRA = 1\n")
    assert _key() != before


def test_an_unrelated_module_leaves_the_key_alone(package: Path):
    before = _key()
    (package / "unrelated.py").write_text("VALUE = 2\n")
    assert _key() == before


def test_a_moved_module_gets_a_new_key(package: Path):
    """Prefect's cached results pickle module paths: after a move the old records must not match."""
    before = _key()
    (package / "stage.py").rename(package / "moved.py")
    code_version.cache_clear()
    assert code_version(f"{PKG}.moved", packages=(PKG,)) != before


def test_a_spurious_ast_depth_error_is_parsed_again(package: Path, monkeypatch):
    """CPython 3.11's "AST constructor recursion depth mismatch" (python/cpython#106905), raised when another thread
    compiles meanwhile, once failed a deployed data flow: the parse is tried again; other SystemErrors stand."""
    from infra.workspace import code_version as module

    real, calls = module.ast.parse, []

    def flaky(source, *args, **kwargs):
        calls.append(source)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=48, after=73)")
        return real(source, *args, **kwargs)

    expected = _key()
    monkeypatch.setattr(module.ast, "parse", flaky)
    assert _key() == expected and len(calls) > 1
    monkeypatch.setattr(module.ast, "parse", lambda *a, **k: (_ for _ in ()).throw(SystemError("something else")))
    with pytest.raises(SystemError, match="something else"):
        _key()


def test_the_real_stages_have_a_code_version():
    code_version.cache_clear()
    for module in ("tasks.data.collect", "flows.data_flow"):
        assert len(code_version(module)) == 64


def test_code_version_reads_modules_without_importing_them():
    """Hashing the data flow's code must not import what its modules import (torch, 177 MB)."""
    import subprocess

    probe = ("import sys; from infra.workspace.code_version import code_version; code_version('flows.pipeline_flow'); "
             "print(sorted(m for m in ('torch', 'models.calibration', 'flows.pipeline_flow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]"


def test_a_nested_module_is_found_on_disk(package: Path):
    (package / "sub").mkdir()
    (package / "sub" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "sub" / "leaf.py").write_text("X = 1\n")
    (package / "stage.py").write_text("from cachekeypkg.sub.leaf import X\n")
    code_version.cache_clear()
    before = code_version(f"{PKG}.stage", packages=(PKG,))  # sub/__init__ would raise if imported
    (package / "sub" / "leaf.py").write_text("X = 2\n")
    code_version.cache_clear()
    assert code_version(f"{PKG}.stage", packages=(PKG,)) != before
