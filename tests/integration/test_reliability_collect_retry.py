"""Transient I/O errors while collecting: Prefect retries with backoff, then succeeds or fails naming the source.

The source file lives behind a symlink (as on a mounted share) whose target disappears after the catalog was
validated (storage that drops out): every read gets a real ENOENT from the OS. In the
flow's process an audit hook watches opens of the source and puts the target back just
before attempt N+1, so the outage lasts a fixed number of attempts, deterministically.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

_FLOW = r"""
import json, os, sys, time
from pathlib import Path
from prefect import flow
from tasks.data.catalog import load_catalog
from infra.workspace.paths import Workspace
from infra.stages import run
from tasks.data.collect import Collect, source_inputs

root = Path(sys.argv[1])
report = {}
for name, outage in (("flaky", 2), ("gone", 99)):
    target = root / f"{name}-storage.jsonl"
    target.write_text('{"text": "one document"}\n{"text": "another document"}\n{"text": 3}\n')
    cat_dir = root / f"cat-{name}"
    cat_dir.mkdir()
    (cat_dir / f"{name}.jsonl").symlink_to(target)
    (cat_dir / "src.yaml").write_text(f"name: {name}\nkind: jsonl\npath: {name}.jsonl\nlicence: cc0\n")
    catalog = load_catalog(cat_dir, data_roots=[root])
    hidden = target.with_suffix(".away")
    os.rename(target, hidden)  # the storage drops out after validation
    watched = str(target)  # catalog paths are resolved, so the reader opens the link's target
    opens = []

    def hook(event, args, watched=watched, opens=opens, outage=outage, target=target, hidden=hidden):
        if event == "open" and args and str(args[0]) == watched:
            opens.append(time.monotonic())
            if len(opens) == outage + 1:
                os.rename(hidden, target)  # ...and comes back

    sys.addaudithook(hook)

    @flow(name=f"collect-{name}")
    def collect_flow():
        source = catalog.sources[0]
        return run(Collect(source, catalog), Workspace(root / f"ws-{name}"), files=source_inputs(catalog, source))

    try:
        result = collect_flow()
        report[name] = {"ok": True, "counts": result.counts, "output": str(result.output)}
    except Exception as exc:
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    report[name]["opens"] = [round(t - opens[0], 2) for t in opens]
print("REPORT " + json.dumps(report))
"""


@pytest.mark.slow
def test_transient_io_errors_are_retried_and_permanent_ones_name_the_source(tmp_path, prefect_env):
    proc = subprocess.run([sys.executable, "-c", _FLOW, str(tmp_path)], cwd=ROOT, env=prefect_env,
                          capture_output=True, text=True, timeout=400)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1].removeprefix("REPORT "))
    log = proc.stdout + proc.stderr

    flaky = report["flaky"]
    assert flaky["ok"], flaky
    assert len(flaky["opens"]) == 3  # two failed attempts, success on the third
    gaps = [b - a for a, b in zip(flaky["opens"], flaky["opens"][1:])]
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9  # retry_delay_seconds=[1, 2, 4]
    assert flaky["counts"]["flaky"]["in"] == 3 and flaky["counts"]["flaky"]["out"] == 2  # the wrong-type line quarantined
    assert "collect-flaky" in log and "Retry" in log  # Prefect logged the retries

    gone = report["gone"]
    assert not gone["ok"]
    assert len(gone["opens"]) == 4  # first try + 3 retries, then give up
    assert "FileNotFoundError" in gone["error"] and "source 'gone'" in gone["error"] and "gone-storage.jsonl" in gone["error"]
    assert "collect-gone" in log
