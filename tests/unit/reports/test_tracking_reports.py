"""The reports' MLflow logging through infra.tracking.runs: no stray runs, and the reward curve from
a metric's history (registered versions and their lineage: tests/integration/test_registry.py)."""
from __future__ import annotations

import pytest

from infra.tracking.runs import log_artifact, log_metrics, log_text, metric_history, set_tag, stage_run
from infra.workspace.paths import Workspace
from tasks.reports.card import reward_curve
from tasks.reports.register import register_final_model


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Workspace:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return Workspace(tmp_path / "work")


@pytest.mark.parametrize(
    "log",
    [
        lambda tmp: log_metrics({"a": 1.0}),
        lambda tmp: log_artifact(tmp / "x.txt"),
        lambda tmp: log_text("x", "x.txt"),
        lambda tmp: set_tag("k", "v"),
        lambda tmp: register_final_model(tmp, "m", {}),
    ],
    ids=["log_metrics", "log_artifact", "log_text", "set_tag", "register_final_model"],
)
def test_logging_outside_a_stage_run_is_a_clear_error(tmp_path, log) -> None:
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(RuntimeError, match="no active MLflow run"):
        log(tmp_path)


def test_reward_curve_reads_the_metric_history_in_step_order(ws, tmp_path) -> None:
    with stage_run(ws, "grpo") as run:
        for step, reward in [(2, 0.5), (0, 0.1), (1, 0.3)]:
            log_metrics({"reward_mean": reward, "accuracy": None}, step=step)
    assert metric_history(run.info.run_id, "reward_mean") == [(0, 0.1), (1, 0.3), (2, 0.5)]
    assert metric_history(run.info.run_id, "accuracy") == []
    png = reward_curve(run.info.run_id, tmp_path / "grpo_reward.png")
    assert png is not None and png.stat().st_size > 1000
    with stage_run(ws, "empty") as empty:
        pass
    assert reward_curve(empty.info.run_id, tmp_path / "none.png") is None
