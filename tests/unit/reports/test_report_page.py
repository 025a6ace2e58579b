"""The report card as a self-contained HTML page, and its wall time over attempts."""
from __future__ import annotations

import base64
import re
from pathlib import Path

from infra.workspace.paths import Workspace
from tasks.reports.card import complete_attempt, inline_images, record_attempt, write_report_html
from tasks.training.loss_curve import loss_curve_png


def test_report_html_inlines_figures_and_renders_tables(tmp_path: Path):
    png = loss_curve_png([1, 2, 3], {"loss": [3.0, 2.0, 1.5]}, tmp_path / "pretrain_loss.png")
    md = tmp_path / "report.md"
    md.write_text("# llmforge report card\n\n| headline | value |\n|---|---|\n| a | 1 |\n\n"
                  "![pretraining loss](pretrain_loss.png)\n![gone](missing.png)\n")
    page = write_report_html(md).read_text()
    assert page.startswith("<!doctype html>") and "<title>llmforge report card</title>" in page
    assert "<table>" in page and "<td>a</td>" in page
    (uri,) = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(uri) == png.read_bytes()
    assert 'src="missing.png"' in page  # a missing figure stays a link, not an error
    assert "data:image/png;base64," in inline_images(md.read_text(), tmp_path)


def test_wall_time_sums_the_attempts_of_one_config(tmp_path: Path, monkeypatch):
    from flows.config import load_pipeline_config

    ws = Workspace(tmp_path / "work")
    tiny, other = load_pipeline_config("tiny"), load_pipeline_config("tiny", {"name": "other"})
    monkeypatch.setattr("atexit.register", lambda *a, **k: None)
    from tasks.reports import card

    record_attempt(ws, tiny, 1000.0)
    card._stamp(ws, 1000.0, ended=1100.0)  # failed after 100 s
    record_attempt(ws, other, 1150.0)  # another config in between: not counted
    card._stamp(ws, 1150.0, ended=1160.0)
    record_attempt(ws, tiny, 1200.0)  # killed: no end, counts until the next attempt
    record_attempt(ws, tiny, 1500.0)  # the one that completes
    monkeypatch.setattr(card.time, "time", lambda: 1560.0)
    assert complete_attempt(ws, tiny, 60.0) == (100.0 + 300.0 + 60.0, 3)
    # A rerun after the completed one starts a new sum.
    record_attempt(ws, tiny, 2000.0)
    monkeypatch.setattr(card.time, "time", lambda: 2010.0)
    assert complete_attempt(ws, tiny, 10.0) == (10.0, 1)
    assert (ws.reports / "attempts.json").is_file()


def test_prefect_artifact_is_skipped_outside_a_flow_run():
    from tasks.reports.data import publish_prefect_artifact

    # Inside runs, one key per stage and run: checked live in tests/integration/test_deployment.py.
    assert publish_prefect_artifact("# outside a run") is None


def test_wide_tables_are_transposed_for_the_prefect_artifact():
    from tasks.reports.data import narrow_tables

    cols = ["collected", "rejected", "exact_duplicates", "near_duplicates", "filtered", "kept", "sampled_docs", "sampled_rows"]
    wide = "\n".join(["# Data funnel", "", "| source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|",
                      "| news | " + " | ".join(str(i) for i in range(8)) + " |",
                      "| **total** | " + " | ".join(str(10 + i) for i in range(8)) + " |", "", "after"])
    narrow = narrow_tables(wide).splitlines()
    assert narrow[:4] == ["# Data funnel", "", "| source | news | **total** |", "|---|---|---|"]
    assert narrow[4:12] == [f"| {c} | {i} | {10 + i} |" for i, c in enumerate(cols)]  # every column kept
    assert narrow[-2:] == ["", "after"]
    small = "| source | kept |\n|---|---|\n| news | 3 |"
    assert narrow_tables(small) == small


def test_long_two_column_tables_become_lists_for_the_prefect_artifact():
    """A label-value table whose labels run long: Prefect's panel would clip the values off; as a list they wrap."""
    from tasks.reports.data import narrow_tables

    label = "GRPO − SFT within the training range (paired, 95% CI) and more words to make it long"
    table = f"intro\n\n| headline | value |\n|---|---|\n| {label} | +4.1 pts [+0.5, +8.0] |\n| preset | |\n\nafter"
    assert narrow_tables(table).splitlines() == [
        "intro", "", "**headline** — **value**", "", f"- {label}: +4.1 pts [+0.5, +8.0]", "- preset", "", "after"]
    assert narrow_tables("| this run | |\n|---|---|\n| " + label + " | a longer value |").splitlines()[0] == "**this run**"
    short = "| headline | value |\n|---|---|\n| preset | tiny |"
    assert narrow_tables(short) == short
    escaped = f"| this run | |\n|---|---|\n| overrides | a=1 \\| b=2, {label} |"
    assert narrow_tables(escaped).splitlines() == ["**this run**", "", f"- overrides: a=1 \\| b=2, {label}"]
    gaps = f"| metric | base | sft |\n|---|---|---|\n| {label}, and on | 1.0 | |\n| x | | |"
    assert narrow_tables(gaps).splitlines()[2:] == [f"- {label}, and on: base 1.0", "- x"]
    assert narrow_tables(gaps.replace("| metric |", "| |")).splitlines()[0] == f"- {label}, and on: base 1.0"  # no heading
    calibration = ("| metric | base | sft | grpo |\n|---|---:|---:|---:|\n"
                   "| bits per byte (comparable across tokenizers) | 1.9633 [1.8891, 2.0408] | 1.9927 [1.9154, 2.0740] | 1.9931 |")
    assert narrow_tables(calibration).splitlines() == [
        "**metric**", "", "- bits per byte (comparable across tokenizers): base 1.9633 [1.8891, 2.0408] · sft 1.9927 [1.9154, 2.0740] · grpo 1.9931"]
