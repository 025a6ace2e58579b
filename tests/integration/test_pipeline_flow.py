"""End to end: the whole pipeline on the built-in corpus (tiny budgets), then a rerun that skips."""
from __future__ import annotations

import pytest

from tests.conftest import run_cli

# The tiny preset with every stage's budget cut to a few steps: this checks the wiring,
# the tracking and the resume, not the model quality (the README's `make run` does that).
SMALL = [
    "pretrain.steps=6", "pretrain.log.eval_every=3", "pretrain.checkpoint.every=3",
    "pretrain.log.every=3", "tokenizer.vocab_size=1024",
    "sft.steps=4", "sft.log.every=2",
    "grpo.steps=2", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.eval_prompts=6",
    "grpo.n_train_problems=8", "eval.n_questions=6", "eval.max_tokens=1024", "eval.temperature_tokens=512",
    "data.mix.total=400000",
]


@pytest.mark.slow
def test_pipeline_end_to_end_tracked_registered_and_resumable(tmp_path, prefect_env):
    work = tmp_path / "work"
    args = ["run", "--preset", "tiny", "--workdir", str(work)] + [a for kv in SMALL for a in ("--set", kv)]
    first = run_cli(args, prefect_env, timeout=1200)
    for k, name in enumerate(("data", "pretrain", "sft", "grpo", "evaluate"), start=1):
        assert f"stage {k}/5 {name}" in first.stdout + first.stderr

    report = (work / "reports" / "latest" / "report.md").read_text()
    assert "held-out arithmetic accuracy SFT → GRPO" in report and "## Calibration" in report
    for png in ("pretrain_loss.png", "sft_loss.png", "calibration_comparison.png"):
        assert (work / "reports" / "latest" / png).stat().st_size > 1000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("llmforge")
    runs = client.search_runs([exp.experiment_id])
    stage_of = {r.info.run_id: r.data.tags.get("llmforge.stage") for r in runs}  # names also list the overrides
    parent = [r for r in runs if stage_of[r.info.run_id] == "pipeline"]
    assert len(parent) == 1 and parent[0].info.run_name.startswith("pipeline pretrain.steps=6")
    children = {stage_of[r.info.run_id] for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert {"data", "pretrain", "sft", "grpo", "evaluate"} <= children
    pre = next(r for r in runs if stage_of[r.info.run_id] == "pretrain")
    assert "unigram_ppl" in pre.data.metrics and client.get_metric_history(pre.info.run_id, "loss")
    versions = client.search_model_versions("name='llmforge-tiny'")
    assert len(versions) == 1
    assert versions[0].tags["pipeline_run_id"] == parent[0].info.run_id and len(versions[0].tags["manifest_sha256"]) == 64

    # Rerun: every stage's inputs and config are unchanged, so no training runs again.
    second = run_cli(args, prefect_env, timeout=1200)
    log = second.stdout + second.stderr
    for stage in ("train-tokenizer", "tokenize-shards", "pretrain", "sft", "grpo", "evaluate"):
        assert any(f"stage {stage}: reused" in line for line in log.splitlines()), (stage, log[-3000:])
    assert "launching:" not in log  # no DeepSpeed launch on the rerun
    assert "report: " in log and "MLflow run: " in log  # the run ends saying where to look
    # The rerun is a repeat of the first pipeline run and says so, with every stage output reused.
    runs = client.search_runs([exp.experiment_id])
    pipelines = [r for r in runs if r.data.tags.get("llmforge.stage") == "pipeline"]
    assert len(pipelines) == 2
    repeat = next(r for r in pipelines if r.info.run_id != parent[0].info.run_id)
    assert repeat.data.tags["llmforge.repeat_of"] == parent[0].info.run_id
