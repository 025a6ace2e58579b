"""The run queue's logic without a launch: how runs split over slots, the progress line, the `runs:` section."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.run_queue import Progress, Queued, RunsConfig, _Pending, split


def pending(costs: list[float]) -> list[_Pending]:
    return [_Pending(i, Queued(None, {}, f"run {i}", c), None) for i, c in enumerate(costs)]  # type: ignore[arg-type]


def test_split_balances_cost_and_keeps_the_queue_order():
    groups = split(pending([1, 2, 4, 8, 16, 32]), 2)
    assert [[r.index for r in g] for g in groups] == [[5], [0, 1, 2, 3, 4]]  # 32 against 31
    assert [[r.index for r in g] for g in split(pending([3, 3, 2, 2, 2]), 2)] == [[0, 2, 4], [1, 3]]


def test_split_makes_no_empty_launch():
    assert len(split(pending([1.0]), 4)) == 1
    assert [len(g) for g in split(pending([1, 1, 1]), 1)] == [3]


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
