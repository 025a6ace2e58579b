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
    # The header says what the run was and what each stage took.
    for row in ("| preset | tiny |", "| overrides (--set) | pretrain.steps=6 ", "| git commit | ", "| machine | ",
                "| precision, pretrain | fp32 (", "| packages | python ", "| stage | wall time | this run |",
                "| pretrain | ", "| evaluate | "):
        assert row in report, (row, report[:2500])
    assert "pretrain.steps" in report.split("| differs from the preset |")[1].split("\n")[0]
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
    assert versions[0].tags["llmforge.preset"] == "tiny" and versions[0].tags["llmforge.precision.grpo"].startswith("fp32")
    assert "champion: the first version" in versions[0].description and "preset `tiny`" in versions[0].description
    # The parent run: what it was (params, tags, description), every stage's headline metrics, only config as params.
    top = client.get_run(parent[0].info.run_id).data
    assert top.params["run.preset"] == "tiny" and top.params["run.overrides"].startswith("pretrain.steps=6")
    assert top.tags["llmforge.git_commit"] and top.tags["llmforge.machine"] and "torch" in top.tags["llmforge.versions"]
    assert top.tags["mlflow.note.content"].startswith("preset `tiny`, changed: ")
    assert {"data/kept", "pretrain/val_ppl", "grpo/heldout_accuracy", "pipeline/wall_minutes",
            "pretrain/wall_minutes", "evaluate/grpo.token.ece"} <= set(top.metrics), sorted(top.metrics)
    assert not {"do_sample", "max_new_tokens", "return_full_text"} & set(top.params)
    data_run = next(r for r in runs if stage_of[r.info.run_id] == "data")
    assert "data.near.threshold" in data_run.data.params and "near.threshold" not in data_run.data.params
    assert "mix.total" in data_run.data.tags["mlflow.note.content"]  # what this stage's config changed

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
    # Same weights: no second model version; the report says the stages were reused, with their own wall times.
    assert len(client.search_model_versions("name='llmforge-tiny'")) == 1
    again = (work / "reports" / "latest" / "report.md").read_text()
    assert "reused 5 of 5 stages (data, pretrain, sft, grpo, evaluate) from earlier runs" in again, again[:3000]
    assert repeat.data.metrics["pipeline/stages_reused"] == 5
    assert repeat.data.metrics["pretrain/wall_minutes"] == top.metrics["pretrain/wall_minutes"]
