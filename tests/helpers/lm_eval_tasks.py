"""A multiple-choice lm-eval task of the user's own, as eval.task_paths reads it offline: a YAML file in a folder and
its items as JSONL (`dataset_path: json` with `data_files`)."""
from __future__ import annotations

import json
from pathlib import Path

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{doc_to_text}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def mc_task_folder(folder: Path, name: str, rows: list[dict], doc_to_text: str = "{{question}}") -> Path:
    """`folder` holding task `name`: `rows` ({"question", "choices", "label"}) asked as `doc_to_text` (Jinja)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data, doc_to_text=doc_to_text))
    return folder
