"""What each stage of a pipeline run took, and whether this run did the work or reused it.

A reused stage keeps the wall time of the run that did its work: a training stage whose folder
was reused hands back the result its own run wrote (an MLflow run under an earlier pipeline
run); a data or evaluation flow whose every output was reused (`llmforge.cache.*` all "hit")
is a repeat of an earlier run (`llmforge.repeat_of`), followed back to the one that worked.
So a fully cached rerun says "reused" with the minutes the work took, not the seconds the rerun took.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

# mlflow is imported inside the functions that use it: a rank that never logs, a data worker and `llmforge --help`
# do not pay for its import.

_MAX_REPEATS = 50  # a chain of repeats is followed this far back at most


class StageTime(BaseModel):
    """One stage of a pipeline run: the MLflow run that did its work, how long it took, whether this run reused it."""

    stage: str
    run_id: str  # the run that did the work (this pipeline's child, or an earlier one's)
    minutes: float | None  # None: that run never ended (killed and not continued)
    reused: bool


def _minutes(run: Any) -> float | None:
    if not run.info.end_time or not run.info.start_time:
        return None
    return (run.info.end_time - run.info.start_time) / 60_000


def _all_reused(run: Any) -> bool:
    cache = [v for k, v in run.data.tags.items() if k.startswith("llmforge.cache.")]
    return bool(cache) and all(v == "hit" for v in cache)


def stage_times(pipeline_run_id: str, stage_runs: Mapping[str, str | None]) -> list[StageTime]:
    """Each of `stage_runs` ({stage: the run id its result names}) with the run that did its work; stages
    without a run id are left out."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client, out = MlflowClient(), []
    for stage, run_id in stage_runs.items():
        if not run_id:
            continue
        try:
            run = client.get_run(run_id)
        except MlflowException:
            continue  # a deleted run: nothing to say about its time
        reused = run.data.tags.get("mlflow.parentRunId") != pipeline_run_id
        origin = run
        for _ in range(_MAX_REPEATS):
            earlier = origin.data.tags.get("llmforge.repeat_of")
            if not earlier or not _all_reused(origin):
                break
            reused = True
            try:
                origin = client.get_run(earlier)
            except MlflowException:
                break
        out.append(StageTime(stage=stage, run_id=origin.info.run_id, minutes=_minutes(origin), reused=reused))
    return out


def child_run(parent_run_id: str, stage: str) -> str | None:
    """The newest run of `stage` (tag `llmforge.stage`) nested under `parent_run_id`; None when there is none."""
    import mlflow
    from mlflow.tracking import MlflowClient

    experiment_id = mlflow.get_run(parent_run_id).info.experiment_id
    found = MlflowClient().search_runs(
        [experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`llmforge.stage` = '{stage}'",
        order_by=["attribute.start_time DESC"], max_results=1)
    return found[0].info.run_id if found else None
