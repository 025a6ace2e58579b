"""What a run was (infra/tracking/identity.py) and what its stages took (infra/tracking/history.py), against a
real SQLite MLflow store: the parent run's params, tags and description; a reused stage keeps its wall time."""
from __future__ import annotations

import time

from flows.config import load_pipeline_config, preset_differences
from infra.tracking.history import child_run, stage_times
from infra.tracking.identity import RunIdentity
from infra.tracking.runs import NOTE_TAG, describe_run, describe_stage_runs, stage_run
from tasks.reports.run_header import identity_lines, stage_lines, wall_row


def _identity() -> RunIdentity:
    config = load_pipeline_config("tiny", {"data.near.threshold": 0.5, "sft.steps": 7})
    return RunIdentity.here("tiny", ["data.near.threshold=0.5", "sft.steps=7", "data.api_token=hunter2"],
                            preset_differences(config, "tiny"))


def test_identity_names_preset_changes_commit_machine_and_packages():
    identity = _identity()
    assert set(identity.differences) == {"data.near.threshold", "sft.steps"}
    preset = load_pipeline_config("tiny")
    assert identity.differences["data.near.threshold"] == (str(preset.data.near.threshold), "0.5")
    assert identity.git_commit and len(identity.git_commit) == 40 and identity.git_dirty in (True, False)
    assert "cores" in identity.machine and {"python", "torch", "mlflow", "prefect"} <= set(identity.packages)
    assert "hunter2" not in " ".join(identity.overrides)  # a secret-named key shows ***
    assert identity.changes_text("data") == f"near.threshold {preset.data.near.threshold} → 0.5"
    table = "\n".join(identity_lines(identity.with_precision({"pretrain": "fp32 (auto: ... 0.025x ...)"})))
    for shown in ("| preset | tiny |", "| overrides (--set) | data.near.threshold=0.5 sft.steps=7", "| git commit | ",
                  "| precision, pretrain | fp32 (auto: ... 0.025x ...) |", "| packages | python "):
        assert shown in table


def test_parent_and_stage_runs_say_what_the_run_was(ws):
    import mlflow

    identity = _identity()
    with stage_run(ws, "pipeline", tags=identity.tags()) as parent:
        describe_run(parent, identity)
        config = load_pipeline_config("tiny")
        with stage_run(ws, "data", config.data, config_key="data"):
            pass
        with stage_run(ws, "sft", config.sft, config_key="sft"):
            pass
        describe_stage_runs(parent.info.run_id, identity)
        describe_run(parent, identity)  # twice (a continued run): one description, params unchanged
    got = mlflow.get_run(parent.info.run_id).data
    assert got.params["run.preset"] == "tiny" and got.params["run.overrides"].startswith("data.near.threshold=0.5")
    assert got.tags["llmforge.preset"] == "tiny" and "torch" in got.tags["llmforge.versions"]
    assert got.tags["llmforge.git_commit"] == identity.git_commit
    note = got.tags[NOTE_TAG]
    steps = load_pipeline_config("tiny").sft.steps
    assert note.count("preset `tiny`") == 1 and "data.near.threshold" in note and f"sft.steps {steps} → 7" in note
    data_run = mlflow.get_run(child_run(parent.info.run_id, "data")).data
    # One key space: a data run logs its config under the pipeline's keys.
    assert data_run.params["data.near.threshold"] == str(config.data.near.threshold) and "near.threshold" not in data_run.params
    data = data_run.tags[NOTE_TAG]
    sft = mlflow.get_run(child_run(parent.info.run_id, "sft")).data.tags[NOTE_TAG]
    assert "near.threshold" in data and "steps" not in data  # each stage run names its own keys only
    assert "steps" in sft and "near.threshold" not in sft


def test_a_cached_rerun_says_reused_and_keeps_the_stages_wall_times(ws):
    with stage_run(ws, "pipeline") as first:
        with stage_run(ws, "data", run_key="k-data", tags={"llmforge.cache.data.near.x": "miss"}) as data1:
            time.sleep(0.3)
        with stage_run(ws, "pretrain") as pretrain1:
            time.sleep(0.3)
    with stage_run(ws, "pipeline") as second:
        with stage_run(ws, "data", run_key="k-data", tags={"llmforge.cache.data.near.x": "hit"}) as data2:
            pass
    times = stage_times(second.info.run_id, {"data": data2.info.run_id, "pretrain": pretrain1.info.run_id})
    assert [(t.stage, t.run_id, t.reused) for t in times] == [
        ("data", data1.info.run_id, True), ("pretrain", pretrain1.info.run_id, True)]
    assert all(t.minutes is not None and t.minutes >= 0.3 / 60 for t in times)
    fresh = stage_times(first.info.run_id, {"data": data1.info.run_id, "pretrain": pretrain1.info.run_id})
    assert not any(t.reused for t in fresh)
    row = wall_row(24.0, None, times)
    assert row.startswith("| pipeline wall time | 0.4 min; reused 2 of 2 stages (data, pretrain) from earlier runs: ")
    assert "reused the output of run" in "\n".join(stage_lines(times))
