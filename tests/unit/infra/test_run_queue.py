"""The run queue's logic without a launch: its order, the claims, the progress line, the `runs:` section."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.run_queue import Progress, Queued, RunsConfig, _Pending, write_queue
from infra.stages import QUEUE_FILE


def pending(costs: list[float]) -> list[_Pending]:
    return [_Pending(i, Queued(None, {}, f"run {i}", c), None) for i, c in enumerate(costs)]  # type: ignore[arg-type]


def test_the_queue_lists_the_longest_runs_first(tmp_path: Path):
    runs = pending([1, 8, 2, 8, 4])
    for r in runs:
        r.job = tmp_path / f"run{r.index}" / "job.json"
    write_queue(tmp_path / "q", runs)
    order = json.loads((tmp_path / "q" / QUEUE_FILE).read_text())
    assert [Path(p).parent.name for p in order] == ["run1", "run3", "run4", "run2", "run0"]


def test_claims_hand_each_run_to_one_launch_only(tmp_path: Path):
    from tasks.training.rank import claimed

    (tmp_path / QUEUE_FILE).write_text(json.dumps(["a/job.json", "b/job.json", "c/job.json"]))
    first, second = claimed(tmp_path, 0, 1), claimed(tmp_path, 0, 1)
    taken = [next(first), next(second), next(first)]
    assert [p.parent.name for p in taken] == ["a", "b", "c"]
    assert list(second) == [] and list(first) == []  # the queue is empty for both


def test_progress_line_counts_runs_and_estimates_from_cost():
    lines: list[str] = []
    progress = Progress(total=3, total_cost=4.0, log=lines.append)
    progress.started -= 10.0  # ten seconds in
    progress.finished(Queued(None, {}, "point 1/3 at C=1e+11", 1.0), "done")  # type: ignore[arg-type]
    assert lines[-1].startswith("run 1/3 done: point 1/3 at C=1e+11 (elapsed 10s, ETA 30s")


def test_runs_section_refuses_what_cannot_run():
    assert RunsConfig().slots == "auto" and RunsConfig(slots=3).slots == 3 and RunsConfig().threads == 1
    for bad in ({"slots": 0}, {"slots": "many"}, {"executor": "dask"}, {"threads": 0}, {"slot": 2}):
        with pytest.raises(ValidationError):
            RunsConfig(**bad)


def test_pipeline_config_takes_a_runs_section(tmp_path: Path):
    from flows.config import resolve_pipeline_config

    config = resolve_pipeline_config(None, "tiny", ["runs.slots=1", "runs.executor=ray"], str(tmp_path))
    assert config.runs.slots == 1 and config.runs.executor == "ray"
