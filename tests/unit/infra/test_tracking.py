"""infra.tracking.runs against a real SQLite MLflow store: every param of a preset logged as is, run
names and origin tags (git, entry point, Prefect flow run, infra/tracking/provenance.py), the Prefect
artifact linking back to the run, and the status a run ends with."""
from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

import pytest

import infra.tracking.provenance as provenance
from infra.tracking.provenance import git_state, link_prefect_to_run
from infra.tracking.runs import describe_overrides, end_status, stage_run, where_to_see_run


def _run(run_id: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient().get_run(run_id)


# ----------------------------------------------------------------------------- redacted params

def test_no_param_of_the_tiny_preset_is_hidden(ws) -> None:
    from flows.config import load_pipeline_config

    config = load_pipeline_config("tiny")
    with stage_run(ws, "pipeline", config) as run:
        pass
    params = _run(run.info.run_id).data.params
    assert len(params) > 100
    assert [k for k, v in params.items() if v == "***"] == []
    assert params["tokenizer.vocab_size"] == str(config.tokenizer.vocab_size)
    assert params["grpo.max_new_tokens"] == str(config.grpo.max_new_tokens)


# ----------------------------------------------------------------------------- names and origin tags


def test_run_name_defaults_to_the_stage_and_can_be_given(ws) -> None:
    with stage_run(ws, "data") as plain:
        pass
    with stage_run(ws, "data", run_name="data near.threshold=0.7") as named:
        pass
    assert _run(plain.info.run_id).info.run_name == "data"
    assert _run(named.info.run_id).info.run_name == "data near.threshold=0.7"
    assert _run(named.info.run_id).data.tags["llmforge.stage"] == "data"


def test_where_to_see_a_run_names_the_store_and_script_by_absolute_paths(ws) -> None:
    with stage_run(ws, "data") as run:
        pass
    line = where_to_see_run(ws, run.info.run_id)
    assert f"ui --backend-store-uri sqlite:///{ws.root.resolve()}/mlflow.db" in line  # sqlite:////abs: any directory
    assert re.search(r"after `/\S+/infra/scripts/start_mlflow_server.sh`", line), line


def test_a_new_run_carries_the_git_commit_and_entry_point(ws, monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/llmforge", "run"])
    head = subprocess.run(["git", "-C", str(provenance.REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    with stage_run(ws, "data") as run:
        pass
    tags = _run(run.info.run_id).data.tags
    assert tags["mlflow.source.name"] == "llmforge"  # not Prefect's engine.py
    if head.returncode == 0:
        assert tags["llmforge.git_commit"] == tags["mlflow.source.git.commit"] == head.stdout.strip()
        assert tags["llmforge.git_dirty"] in ("true", "false")
    assert not any(k.startswith("llmforge.prefect_") for k in tags)  # not inside a flow run


def test_git_tags_are_absent_outside_a_git_checkout(ws, tmp_path, monkeypatch) -> None:
    outside = tmp_path / "not-a-checkout"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setattr(provenance, "REPO_ROOT", outside)
    assert git_state(outside) == {}
    with stage_run(ws, "data") as run:
        pass
    tags = _run(run.info.run_id).data.tags
    assert "llmforge.git_commit" not in tags and "llmforge.git_dirty" not in tags
    assert "mlflow.source.git.commit" not in tags


def test_git_state_reads_the_commit_and_whether_the_tree_is_dirty(tmp_path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert git_state(repo) == {"commit": sha, "dirty": "false"}
    (repo / "a.txt").write_text("b")
    assert git_state(repo) == {"commit": sha, "dirty": "true"}


def test_a_resumed_run_keeps_its_name_and_tags(ws) -> None:
    with stage_run(ws, "pretrain", run_name="pretrain lr=1e-3") as first:
        pass
    with stage_run(ws, "other", run_id=first.info.run_id, tags={"x": "y"}) as resumed:
        assert resumed.info.run_id == first.info.run_id
    run = _run(first.info.run_id)
    assert run.info.run_name == "pretrain lr=1e-3" and run.data.tags["llmforge.stage"] == "pretrain"
    assert "x" not in run.data.tags


# ----------------------------------------------------------------------------- Prefect flow run link


@pytest.fixture
def in_flow_run(monkeypatch):
    """Pretend to run inside Prefect flow run `FLOW_RUN_ID` of flow `data`, with a UI at prefect.example;
    returns the artifacts created, as (kind, kwargs)."""
    from prefect import artifacts
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL, temporary_settings

    created: list[tuple[str, dict]] = []
    monkeypatch.setattr(flow_run, "get_id", lambda: FLOW_RUN_ID)
    monkeypatch.setattr(flow_run, "get_flow_name", lambda: "data")
    monkeypatch.setattr(artifacts, "create_link_artifact", lambda **kw: created.append(("link", kw)))
    monkeypatch.setattr(artifacts, "create_markdown_artifact", lambda **kw: created.append(("markdown", kw)))
    with temporary_settings(updates={PREFECT_UI_URL: "http://prefect.example:4200"}):
        yield created


FLOW_RUN_ID = "0b6c4a2e-1f7d-4c1e-9a55-3d2f8e7a9b10"


def test_inside_a_flow_run_the_run_is_tagged_with_it_and_linked_back(ws, in_flow_run) -> None:
    with stage_run(ws, "data") as run:
        pass
    with stage_run(ws, "data") as again:
        pass
    tags = _run(run.info.run_id).data.tags
    assert tags["llmforge.prefect_flow_run_id"] == FLOW_RUN_ID
    assert tags["llmforge.prefect_flow_run_url"] == f"http://prefect.example:4200/runs/flow-run/{FLOW_RUN_ID}"
    assert tags["mlflow.source.name"] == "data"
    # A SQLite store has no web address: the artifact says how to open the run instead.
    (kind, first), (_, second) = in_flow_run
    assert kind == "markdown"
    assert f"mlflow ui --backend-store-uri sqlite:///{ws.mlflow_db}" in first["markdown"]
    # A clickable link to the local UI's address of the run.
    assert f"(http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id})" in first["markdown"]
    assert first["markdown"].startswith(f"[MLflow run {run.info.run_id}](")
    # One key per flow and stage, never per run: each run is a new version of the same artifact (its history).
    assert first["key"] == second["key"] == "data-mlflow-data"


def test_with_an_mlflow_server_the_artifact_is_a_link_to_the_run(in_flow_run, monkeypatch) -> None:
    import mlflow

    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: "http://mlflow.example:5000/")
    run = SimpleNamespace(info=SimpleNamespace(experiment_id="3", run_id="abc123def456789"))
    link_prefect_to_run("Eval base", run, {"id": FLOW_RUN_ID})
    [(kind, kw)] = in_flow_run
    assert kind == "link" and kw["link"] == "http://mlflow.example:5000/#/experiments/3/runs/abc123def456789"
    assert kw["key"] == "llmforge-mlflow-eval-base"


def test_a_failing_prefect_artifact_does_not_fail_the_stage(ws, in_flow_run, monkeypatch) -> None:
    from prefect import artifacts

    def refuse(**kw):
        raise ConnectionError("no Prefect API")

    monkeypatch.setattr(artifacts, "create_markdown_artifact", refuse)
    with pytest.warns(UserWarning, match="could not create the Prefect artifact"):
        with stage_run(ws, "data") as run:
            pass
    assert _run(run.info.run_id).info.status == "FINISHED"


# ----------------------------------------------------------------------------- run status


def _prefect_exceptions():
    from prefect.exceptions import Abort, CancelledRun, TerminationSignal

    return [(TerminationSignal(15), "KILLED"), (CancelledRun("cancelled"), "KILLED"), (Abort("abort"), "KILLED")]


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (RuntimeError("boom"), "FAILED"),
        (ValueError("bad config"), "FAILED"),
        (KeyboardInterrupt(), "KILLED"),
        (SystemExit(143), "KILLED"),  # a SIGTERM handler's sys.exit(128 + 15)
        (SystemExit(1), "FAILED"),
        *_prefect_exceptions(),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v,
)
def test_a_run_left_by_an_exception_ends_failed_or_killed(ws, exc, status) -> None:
    with pytest.raises(type(exc)):
        with stage_run(ws, "pretrain") as run:
            raise exc
    assert _run(run.info.run_id).info.status == status
    assert end_status(exc) == status


def test_a_run_ends_finished_normally_and_on_a_clean_exit(ws) -> None:
    import mlflow

    with stage_run(ws, "data") as ok:
        pass
    with pytest.raises(SystemExit):
        with stage_run(ws, "data") as clean:
            raise SystemExit(0)
    assert _run(ok.info.run_id).info.status == _run(clean.info.run_id).info.status == "FINISHED"
    assert mlflow.active_run() is None


def test_an_interrupt_kills_the_stage_run_and_its_pipeline_run(ws) -> None:
    import mlflow

    with pytest.raises(KeyboardInterrupt):
        with stage_run(ws, "pipeline") as parent:
            with stage_run(ws, "data") as child:
                raise KeyboardInterrupt
    assert _run(child.info.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert _run(child.info.run_id).info.status == _run(parent.info.run_id).info.status == "KILLED"
    assert mlflow.active_run() is None


def test_a_failed_stage_fails_its_pipeline_run_while_earlier_stages_stay_finished(ws) -> None:
    with pytest.raises(RuntimeError):
        with stage_run(ws, "pipeline") as parent:
            with stage_run(ws, "data") as done:
                pass
            with stage_run(ws, "pretrain") as failed:
                raise RuntimeError("diverged")
    statuses = [_run(r.info.run_id).info.status for r in (done, failed, parent)]
    assert statuses == ["FINISHED", "FAILED", "FAILED"]


# ----------------------------------------------------------------------------- describe_overrides


def test_describe_overrides_drops_the_prefix_of_the_stage_named() -> None:
    assert describe_overrides(["data.near.threshold=0.7"], stage="data") == "near.threshold=0.7"
    assert describe_overrides({"data.near.threshold": 0.7, "data.mix.seed": 3}, "data") == "near.threshold=0.7 mix.seed=3"
    assert describe_overrides([]) == ""
    # A pipeline run's name keeps the stage: `optim.lr` alone could be any training stage's.
    assert describe_overrides(["grpo.optim.lr=2e-5"]) == "grpo.optim.lr=2e-5"
    assert describe_overrides(["data=x"], stage="data") == "data=x"  # a key that is the stage alone stays whole


def test_describe_overrides_keeps_full_keys_across_stages_or_picks_one_stage() -> None:
    overrides = ["data.near.threshold=0.7", "pretrain.optim.lr = 1e-3"]
    assert describe_overrides(overrides) == "data.near.threshold=0.7 pretrain.optim.lr=1e-3"
    assert describe_overrides(overrides, stage="pretrain") == "optim.lr=1e-3"
    assert describe_overrides(overrides, stage="sft") == ""


def test_describe_overrides_hides_secrets_and_refuses_malformed_pairs() -> None:
    assert describe_overrides(["hub.token=hf_abc", "hub.repo=x"]) == "hub.token=*** hub.repo=x"
    with pytest.raises(ValueError, match="not key=value"):
        describe_overrides(["data.near.threshold"])
