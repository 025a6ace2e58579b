"""`llmforge gc`'s view of a workspace: a store inside another (eval/items, eval/targets inside eval) is no output
folder of the outer one, and a run's tag keeps the folder of the deepest store its path lies in."""
from __future__ import annotations

from infra.tracking.outputs import output_folder_of, output_folders
from infra.workspace.paths import Workspace


def test_nested_stores_are_told_apart(tmp_path):
    ws = Workspace(tmp_path)
    for rel in ("eval/abc", "eval/items/def", "eval/targets/ghi", "data/near/jkl", "checkpoints/sft/mno"):
        (tmp_path / rel).mkdir(parents=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in output_folders(ws)) == [
        "checkpoints/sft/mno", "data/near/jkl", "eval/abc", "eval/items/def", "eval/targets/ghi"]
    assert output_folder_of(ws, "eval/items/def/items.jsonl") == "eval/items/def"
    assert output_folder_of(ws, "eval/abc/eval.json") == "eval/abc"
    assert output_folder_of(ws, "checkpoints/sft/mno/model/model.safetensors") == "checkpoints/sft/mno"
    assert output_folder_of(ws, "reports/xyz/report.md") is None
