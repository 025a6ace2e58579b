"""Fuzz catalog YAML: every malformed source is a ConfigError naming the file, before any work.

Valid mutations must load; invalid ones must raise ConfigError (never KeyError, TypeError,
a pydantic traceback, or a silently accepted NaN weight).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from infra.config import ConfigError
from tasks.data.catalog import load_catalog

BASE = {"name": "src", "kind": "jsonl", "path": "data.jsonl", "licence": "cc0"}

BAD_VALUES = {
    "weight": [0, -1, -0.5, float("nan"), float("inf"), float("-inf"), "heavy", None, [1], {"a": 1}],
    "max_documents": [0, -3, "ten", 1.5],
    "max_epochs": [0, -1, "x"],
    "max_line_bytes": [0, -1, "big"],
    "max_inflated_bytes": [0, -1, "1GiB"],
    "max_file_bytes": [0, -5, "10MB", 1.5],
    "name": ["", "bad name", "../escape", "/abs", 7, None, "-dash-first"],
    "kind": ["csv", "", None, 3, "JSONL"],
    "text_field": [None, 3, ["text"], {"k": "v"}],
    "path": ["missing.jsonl", "../../../etc/passwd", "*.nomatch", None],
    "licence": [None, ["cc0"], {"x": 1}],
    "filters": ["strict", 3, {"no_such_rule": 1}],
    "builtin": ["python_everything"],
    "allow_outside_roots": ["maybe", [True]],
}
GOOD_VALUES = {
    "weight": [0.001, 1, 2.5, 1e6],
    "max_documents": [1, 10],
    "text_field": ["body", "content"],
    "id_field": ["id", None],
    "max_epochs": [0.5, 10],
    "max_inflated_bytes": [1, 1 << 34],
    "max_file_bytes": [1, 10 << 20],
}


def _load(doc: str) -> object:
    with tempfile.TemporaryDirectory() as tmp:
        cat = Path(tmp) / "cat"
        cat.mkdir()
        (cat / "data.jsonl").write_text('{"text": "x"}\n')
        (cat / "src.yaml").write_text(doc)
        return load_catalog(cat, data_roots=[cat])


def _dump(data: dict) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(BAD_VALUES)), data=st.data())
def test_bad_values_are_config_errors_naming_file_and_key(key, data):
    value = data.draw(st.sampled_from(BAD_VALUES[key]))
    with pytest.raises(ConfigError) as info:
        _load(_dump({**BASE, key: value}))
    msg = str(info.value)
    assert "src.yaml" in msg and key in msg, msg


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(GOOD_VALUES)), data=st.data())
def test_good_values_load(key, data):
    value = data.draw(st.sampled_from(GOOD_VALUES[key]))
    catalog = _load(_dump({**BASE, key: value}))
    source = catalog.sources[0]
    assert getattr(source, key) == value
    assert all(math.isfinite(w) and w > 0 for w in catalog.weights().values())


@settings(max_examples=60, deadline=None)
@given(extra=st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in BASE and k not in GOOD_VALUES
                                                                      and k not in BAD_VALUES and k not in ("glob", "hf")),
                             st.integers() | st.text(max_size=5), min_size=1, max_size=3))
def test_unknown_keys_are_rejected(extra):
    with pytest.raises(ConfigError, match="src.yaml"):
        _load(_dump({**BASE, **extra}))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.one_of(
    st.text(max_size=200),  # arbitrary text: mostly not YAML mappings
    st.binary(max_size=100).map(lambda b: b.decode("latin-1")),
    st.recursive(st.none() | st.integers() | st.text(max_size=8), lambda c: st.lists(c, max_size=3)
                 | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8).map(_dump),
))
def test_arbitrary_documents_load_or_raise_config_error(doc):
    try:
        _load(doc)
    except ConfigError as exc:
        assert "src.yaml" in str(exc)
