"""A stage's result is recorded as JSON beside its files, never pickled, and a workspace that was
copied or moved reuses every stage with its paths pointing into the new place (issue 26, item 7).
Its key covers its declared inputs by content, not the names of anything."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import BaseModel

from infra.stages import RESULT_FILE, Stage, place, run
from infra.workspace.paths import Workspace
from infra.workspace.record import RECORD_FILE

CALLS: list[str] = []


class Made(BaseModel):
    folder: Path
    file: Path
    n: int


class MakeFile(Stage):
    name, store, Config, Result = "make-file", "tokens", int, Made
    inputs = ("source",)

    def compute(self, inputs: dict, out_dir: Path) -> Made:
        CALLS.append(str(out_dir))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "data.txt").write_text(inputs["source"].read_text() * self.config)
        return Made(folder=out_dir, file=out_dir / "data.txt", n=self.config)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    CALLS.clear()
    path = tmp_path / "source.txt"
    path.write_text("x")
    return path


def test_a_result_is_json_and_a_moved_workspace_reuses_it(tmp_path: Path, source: Path) -> None:
    first = Workspace(tmp_path / "a")
    placed = place(MakeFile(3), first, source=source)
    made = placed.run()
    assert made.file == placed.out_dir / "data.txt" and CALLS == [str(placed.out_dir)]
    recorded = json.loads((placed.out_dir / RESULT_FILE).read_text())
    assert recorded["file"].startswith("./tokens/")  # relative to the workspace, not its absolute path
    assert RESULT_FILE in json.loads((placed.out_dir / RECORD_FILE).read_text())["files"]  # verified like the data
    assert not (first.root / ".prefect-cache").exists()  # nothing pickled anywhere

    assert run(MakeFile(3), first, source=source) == made and len(CALLS) == 1  # reused, not rerun

    moved = Workspace(tmp_path / "b")
    shutil.move(first.root, moved.root)
    there = run(MakeFile(3), moved, source=source)
    assert len(CALLS) == 1 and there.file == moved.root / made.file.relative_to(first.root)
    assert there.file.read_text() == "xxx"


def test_the_key_follows_config_and_input_content(tmp_path: Path, source: Path) -> None:
    ws = Workspace(tmp_path / "w")
    key = place(MakeFile(3), ws, source=source).key
    assert place(MakeFile(4), ws, source=source).key != key
    source.write_text("yy")
    assert place(MakeFile(3), ws, source=source).key != key
    with pytest.raises(TypeError, match=r"declares inputs \['source'\], got \['src'\]"):
        place(MakeFile(3), ws, src=source)


def test_a_damaged_output_is_rerun_saying_which_file(tmp_path: Path, source: Path, capsys) -> None:
    ws = Workspace(tmp_path / "w")
    made = run(MakeFile(4), ws, source=source)
    made.file.write_text("yyyy")
    redone = run(MakeFile(4), ws, source=source)
    assert len(CALLS) == 2 and redone.file.read_text() == "xxxx"
    assert "data.txt does not match its recorded sha256" in capsys.readouterr().out


def test_a_damaged_record_is_rerun_not_loaded(tmp_path: Path, source: Path) -> None:
    ws = Workspace(tmp_path / "w")
    folder = place(MakeFile(2), ws, source=source)
    folder.run()
    (folder.out_dir / RECORD_FILE).write_text((folder.out_dir / RECORD_FILE).read_text()[:40])  # truncated
    run(MakeFile(2), ws, source=source)
    assert len(CALLS) == 2
