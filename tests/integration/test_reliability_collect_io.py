"""An unreadable source fails collection with an OSError naming the source and file, leaving no output behind."""
from __future__ import annotations

import os

import pytest

from tasks.data.catalog import load_catalog
from tasks.data.collect import _retry_on_io_error, collect_source


def test_vanished_source_names_source_and_file_and_leaves_nothing(tmp_path):
    storage = tmp_path / "storage.jsonl"
    storage.write_text('{"text": "a document"}\n')
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "web.jsonl").symlink_to(storage)
    (tmp_path / "cat" / "src.yaml").write_text("name: web\nkind: jsonl\npath: web.jsonl\nlicence: cc0\n")
    catalog = load_catalog(tmp_path / "cat", data_roots=[tmp_path])
    os.rename(storage, tmp_path / "elsewhere")  # the storage drops out after validation

    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=r"source 'web': No such file or directory: .*storage\.jsonl") as info:
        collect_source(catalog, catalog.sources[0], out)
    assert isinstance(info.value, OSError)  # still retried by the Prefect task's retry condition
    assert list(out.iterdir()) == []  # no partial output, not even temp files

    class Failed:
        def result(self):
            raise info.value

    assert _retry_on_io_error(None, None, Failed()) is True

    os.rename(tmp_path / "elsewhere", storage)  # back: the same call succeeds
    result = collect_source(catalog, catalog.sources[0], out)
    assert result.counts["web"]["out"] == 1
