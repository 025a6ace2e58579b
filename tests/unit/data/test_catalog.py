"""The catalog fails before any work, naming the file and the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ConfigError
from tasks.data.catalog import load_catalog
from tests.conftest import ROOT


def write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_default_catalog_loads():
    cat = load_catalog(ROOT / "data_catalog")
    names = [s.name for s in cat.sources]
    assert names == ["python_docs", "python_stdlib"]
    assert abs(sum(cat.weights().values()) - 1.0) < 1e-9


def test_unknown_key_names_file_and_key(tmp_path):
    write(tmp_path / "data" / "a.jsonl", '{"text": "x"}\n')
    f = write(tmp_path / "cat" / "a.yaml", "name: a\nkind: jsonl\npath: ../data/a.jsonl\nlicence: MIT\nwieght: 2\n")
    with pytest.raises(ConfigError) as err:
        load_catalog(tmp_path / "cat", data_roots=[tmp_path])
    assert str(f) in str(err.value) and "wieght" in str(err.value)


def test_missing_path_is_an_error(tmp_path):
    write(tmp_path / "cat" / "a.yaml", "name: a\nkind: jsonl\npath: nope.jsonl\nlicence: MIT\n")
    with pytest.raises(ConfigError, match="key 'path'.*does not exist"):
        load_catalog(tmp_path / "cat")


@pytest.mark.parametrize("weight", ["0", "-1", ".nan", ".inf"])
def test_bad_weights(tmp_path, weight):
    write(tmp_path / "cat" / "d.jsonl", '{"text": "x"}\n')
    write(tmp_path / "cat" / "a.yaml", f"name: a\nkind: jsonl\npath: d.jsonl\nlicence: MIT\nweight: {weight}\n")
    with pytest.raises(ConfigError, match="key 'weight'"):
        load_catalog(tmp_path / "cat")


def test_duplicate_source_names(tmp_path):
    write(tmp_path / "cat" / "d.jsonl", '{"text": "x"}\n')
    for f in ("a.yaml", "b.yaml"):
        write(tmp_path / "cat" / f, "name: same\nkind: jsonl\npath: d.jsonl\nlicence: MIT\n")
    with pytest.raises(ConfigError, match="also defined"):
        load_catalog(tmp_path / "cat")


def test_path_escaping_data_roots(tmp_path):
    outside = write(tmp_path / "outside" / "d.jsonl", '{"text": "x"}\n')
    write(tmp_path / "proj" / "cat" / "a.yaml", f"name: a\nkind: jsonl\npath: {outside}\nlicence: MIT\n")
    with pytest.raises(ConfigError, match="outside the data roots"):
        load_catalog(tmp_path / "proj" / "cat")
    # a symlink inside the roots that points outside is caught too
    link = tmp_path / "proj" / "cat" / "link.jsonl"
    link.symlink_to(outside)
    write(tmp_path / "proj" / "cat" / "a.yaml", "name: a\nkind: jsonl\npath: link.jsonl\nlicence: MIT\n")
    with pytest.raises(ConfigError, match="outside the data roots"):
        load_catalog(tmp_path / "proj" / "cat")
    write(tmp_path / "proj" / "cat" / "a.yaml", "name: a\nkind: jsonl\npath: link.jsonl\nlicence: MIT\nallow_outside_roots: true\n")
    assert load_catalog(tmp_path / "proj" / "cat").sources[0].name == "a"


def test_kind_specific_keys(tmp_path):
    write(tmp_path / "cat" / "a.yaml", "name: a\nkind: builtin\nlicence: MIT\n")
    with pytest.raises(ConfigError, match="needs key 'builtin'"):
        load_catalog(tmp_path / "cat")


def test_unknown_filter_set(tmp_path):
    write(tmp_path / "cat" / "d.jsonl", '{"text": "x"}\n')
    write(tmp_path / "cat" / "a.yaml", "name: a\nkind: jsonl\npath: d.jsonl\nlicence: MIT\nfilters:\n  filter_set: nonsense\n")
    with pytest.raises(ConfigError, match="filters"):
        load_catalog(tmp_path / "cat")
