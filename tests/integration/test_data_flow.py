"""End to end: the data flow on tiny data with Prefect's ephemeral API and MLflow on SQLite."""
from __future__ import annotations

import subprocess

import pyarrow.parquet as pq
import pytest

from tasks.data.manifest import load_manifest, shard_paths
from tests.conftest import CLI, ROOT
from tests.helpers.data_flow import make_preset, run_cli
from tests.helpers.lm_eval_tasks import mc_task_folder

CAPITAL = "Which city has been the capital of France since the late tenth century, under the Capetian kings?"


@pytest.mark.slow
def test_data_flow_end_to_end_and_cached_rerun(tmp_path, prefect_env):
    preset = make_preset(tmp_path, "  near:\n    threshold: 0.7\n")
    # An lm-eval task of the user's own (a YAML folder, read offline) and one of its items inside a letter: the
    # data flow alone decontaminates against eval.tasks (issue 50).
    tasks = mc_task_folder(tmp_path / "eval_tasks", "capitals", [{"question": CAPITAL, "choices": ["Rome", "Paris"],
                                                                   "label": 1}])
    (tmp_path / "catalog" / "texts" / "quiz.txt").write_text(f"Letter about a quiz. {CAPITAL} Paris. Signed, a reader.")
    sets = ["--set", "eval.tasks=[arithmetic, capitals]", "--set", f"eval.task_paths=[{tasks}]"]
    work = tmp_path / "work"
    run_cli(["data", "--preset", str(preset), "--workdir", str(work), *sets], prefect_env)

    manifest_path = work / "data" / "shards" / "latest" / "manifest.json"
    m = load_manifest(manifest_path)
    f = m.funnel
    assert f["news"]["collected"] == 19 and f["news"]["rejected"] == 4
    assert f["news"]["exact_duplicates"] == 1 and f["news"]["near_duplicates"] == 1
    assert f["letters"]["rejected"] == 1 and f["news"]["filtered"] >= 1
    assert f["letters"]["contaminated"] == 1 and f["letters"]["contaminated:capitals"] == 1
    assert m.decontamination["capitals"]["items_found"] == 1 and m.decontamination["arithmetic"]["items_found"] == 0
    for row in f.values():
        assert row["collected"] == (row["kept"] + row["rejected"] + row["contaminated"] + row["exact_duplicates"]
                                    + row["near_duplicates"] + row["filtered"])
    rows = sum(pq.read_table(p).num_rows for p in shard_paths(manifest_path))
    assert rows == m.stats["rows"] and len(m.shards) >= 2
    assert m.mix["sources"]["news"]["achieved"] == pytest.approx(0.7, abs=0.1)
    # nothing lost: every removed document is in a quarantine file with its reason
    removed = sum(pq.read_table(p).num_rows for p in m.removed_files if "mix" not in p)
    assert removed == sum(r["collected"] - r["kept"] for r in f.values())

    # The MLflow run holds the config, the funnel, the artifacts and the dataset input.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("llmforge")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.metrics["funnel.news.near_duplicates"] == 1.0
    assert run.data.params["data.near.threshold"] == "0.7"  # the pipeline run's key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "data")}
    assert {"data/manifest.json", "data/data_report.md", "data/funnel.png", "data/decontamination.json"} <= artifacts
    assert run.data.metrics["decontamination.capitals.items_found"] == 1.0
    assert run.inputs.dataset_inputs and run.inputs.dataset_inputs[0].dataset.name == "pretraining-shards"

    # A rerun with the same inputs and config reuses every stage's verified folder (no task runs).
    second = run_cli(["data", "--preset", str(preset), "--workdir", str(work), *sets], prefect_env)
    log = second.stdout + second.stderr
    for stage in ("collect", "eval_items", "decontaminate", "exact_dedup", "near_dedup", "quality", "mix", "write_shards"):
        assert any(f"stage {stage}: reused" in line for line in log.splitlines()), (stage, log[-3000:])
    assert "Completed()" not in "\n".join(l for l in log.splitlines() if "Task run" in l)
    assert load_manifest(manifest_path).funnel == f


def test_cli_help_and_bad_catalog(tmp_path, prefect_env):
    out = subprocess.run(CLI + ["--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "data" in out.stdout
    for cmd in ("run", "data", "show-config"):
        sub = subprocess.run(CLI + [cmd, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert sub.returncode == 0 and "--preset" in sub.stdout
    bad = tmp_path / "cat"
    bad.mkdir()
    (bad / "x.yaml").write_text("name: x\nkind: jsonl\npath: missing.jsonl\nlicence: MIT\n")
    proc = subprocess.run(
        CLI + ["data", "--catalog", str(bad), "--workdir", str(tmp_path / "w")], cwd=ROOT, env=prefect_env,
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "x.yaml" in proc.stderr and "key 'path'" in proc.stderr
