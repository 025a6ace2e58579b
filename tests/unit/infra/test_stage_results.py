"""A stage's result is recorded as JSON beside its files, never pickled, and a workspace that was
copied or moved reuses every stage with its paths pointing into the new place (issue 26, item 7)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from prefect import task
from pydantic import BaseModel

from infra.paths import Workspace
from infra.stage_cache import OUT, run_into
from infra.stage_record import RECORD_FILE

CALLS: list[str] = []


class Made(BaseModel):
    folder: Path
    file: Path
    n: int


@task(name="make-file")
def make_file(out_dir: Path, n: int) -> Made:
    CALLS.append(str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "data.txt").write_text("x" * n)
    return Made(folder=out_dir, file=out_dir / "data.txt", n=n)


def test_a_result_is_json_and_a_moved_workspace_reuses_it(tmp_path: Path) -> None:
    CALLS.clear()
    first = Workspace(tmp_path / "a")
    made, folder = run_into(make_file, first, "tokens", OUT, 3)
    assert made.file == folder / "data.txt" and CALLS == [str(folder)]
    record = json.loads((folder / RECORD_FILE).read_text())
    assert record["result"]["file"].startswith("./tokens/")  # relative to the workspace, not its absolute path
    assert not (first.root / ".prefect-cache").exists()  # nothing pickled anywhere

    again, _ = run_into(make_file, first, "tokens", OUT, 3)
    assert again == made and len(CALLS) == 1  # reused, not rerun

    moved = Workspace(tmp_path / "b")
    shutil.move(first.root, moved.root)
    there, moved_folder = run_into(make_file, moved, "tokens", OUT, 3)
    assert len(CALLS) == 1 and there.file == moved_folder / "data.txt" and there.file.read_text() == "xxx"


def test_a_damaged_output_is_rerun_saying_which_file(tmp_path: Path) -> None:
    CALLS.clear()
    ws = Workspace(tmp_path)
    _, folder = run_into(make_file, ws, "tokens", OUT, 4)
    (folder / "data.txt").write_text("yyyy")
    said: list[str] = []
    redone, _ = run_into(make_file, ws, "tokens", OUT, 4, log=said.append)
    assert len(CALLS) == 2 and redone.file.read_text() == "xxxx"
    assert any("data.txt does not match its recorded sha256" in line for line in said)


def test_a_damaged_record_is_rerun_not_loaded(tmp_path: Path) -> None:
    CALLS.clear()
    ws = Workspace(tmp_path)
    _, folder = run_into(make_file, ws, "tokens", OUT, 2)
    (folder / RECORD_FILE).write_text((folder / RECORD_FILE).read_text()[:40])  # truncated
    run_into(make_file, ws, "tokens", OUT, 2)
    assert len(CALLS) == 2
