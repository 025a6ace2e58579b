"""A refusal of the user's input, even one a flow's stage raises, ends the CLI in one line with its exit code and no
traceback (Prefect's logs of the failed runs included); LLMFORGE_DEBUG=1 shows the tracebacks (issue 52)."""
from __future__ import annotations

import json
import subprocess

from tests.conftest import CLI, ROOT


def test_a_catalog_of_empty_documents_is_refused_in_one_line_and_debug_shows_why(tmp_path, isolated_env):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "e.jsonl").write_text("\n".join(json.dumps({"text": "", "id": f"e{i}"}) for i in range(5)) + "\n")
    (catalog / "e.yaml").write_text("name: e\nkind: jsonl\npath: e.jsonl\nid_field: id\nlicence: CC0-1.0\nweight: 1\n"
                                    "filters:\n  filter_set: none\n")
    command = CLI + ["run", "--workdir", str(tmp_path / "work"), "--set", f"data.catalog={catalog}"]
    out = subprocess.run(command, cwd=ROOT, env=isolated_env, capture_output=True, text=True, timeout=600)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]  # Prefect's exit line follows
    assert len(errors) == 1 and errors[0].startswith("error: the data flow kept no documents"), said[-2000:]
    debug = subprocess.run(command, cwd=ROOT, env={**isolated_env, "LLMFORGE_DEBUG": "1"}, capture_output=True,
                           text=True, timeout=600)
    assert debug.returncode == 2 and "Traceback" in debug.stdout + debug.stderr
