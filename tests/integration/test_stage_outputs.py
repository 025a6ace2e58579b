"""Content-addressed stage outputs with real Prefect and MLflow: variants of the data flow in
one workspace never break each other, every MLflow run keeps pointing at shards that verify,
a damaged cached output is rerun, a changed source re-collects only itself, and gc removes
only what no run refers to."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.data.manifest import shard_paths
from tests.helpers.data_flow import make_preset, run_cli

pytestmark = pytest.mark.slow


def _data(work: Path, preset: Path, env: dict, threshold: float):
    return run_cli(["data", "--preset", str(preset), "--workdir", str(work), "--set", f"data.near.threshold={threshold}"], env)


def _data_runs(work: Path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("llmforge")
    runs = client.search_runs([exp.experiment_id], order_by=["attribute.start_time ASC"])
    return [r for r in runs if r.data.tags.get("llmforge.stage") == "data"]


def _cache(run, store: str) -> dict[str, str]:
    prefix = f"llmforge.cache.{store}."
    return {k[len(prefix):]: v for k, v in run.data.tags.items() if k.startswith(prefix)}


def test_variants_in_one_workspace_keep_every_run_verifiable(tmp_path, prefect_env):
    preset = make_preset(tmp_path)
    cat = tmp_path / "catalog"
    work = tmp_path / "work"

    for threshold in (0.5, 0.95, 0.5):
        _data(work, preset, prefect_env, threshold)
    runs = _data_runs(work)
    assert len(runs) == 3
    manifests = [Path(r.data.tags["llmforge.manifest"]) for r in runs]
    for m in manifests:  # every run still points at its own shards, and they verify
        assert shard_paths(m)
    assert manifests[0] == manifests[2] != manifests[1]
    assert manifests[0].parent.parent == work / "data" / "shards"
    assert set(_cache(runs[2], "data.shards").values()) == {"hit"}
    assert set(_cache(runs[2], "data.near").values()) == {"hit"}
    assert runs[1].info.run_name == "data near.threshold=0.95" and runs[2].data.tags["llmforge.repeat_of"] == runs[0].info.run_id
    diff = run_cli(["runs", "--workdir", str(work), "--diff", runs[0].info.run_id[:10], runs[1].info.run_id[:10]], prefect_env)
    assert "near.threshold: 0.5 -> 0.95" in diff.stdout and "1 config key(s) differ" in diff.stdout

    # One run for two things: one source gets a new record, the other source's cached output is
    # damaged. The first is re-collected alone; the damage is found and that stage reruns, saying so.
    news = cat / "news.jsonl"
    news.write_text(news.read_text() + json.dumps({"text": "A new letter about rivers and bridges."}) + "\n")
    (letters,) = [p for p in (work / "data" / "collect").glob("*/letters.parquet")]
    damaged = bytearray(letters.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    letters.write_bytes(bytes(damaged))
    out = _data(work, preset, prefect_env, 0.5)
    log = out.stdout + out.stderr
    assert "failed verification" in log and "letters.parquet does not match its recorded sha256" in log
    collect = _cache(_data_runs(work)[-1], "data.collect")
    assert sorted(collect.values()) == ["miss", "rerun"]
    assert collect[letters.parent.name] == "rerun" and letters.read_bytes() != bytes(damaged)

    # gc: nothing to do while every run exists; with the 0.95 run deleted its own folders go, the rest stay.
    dry = run_cli(["gc", "--workdir", str(work)], prefect_env)
    assert "0 unreferenced folder(s)" in dry.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    client.delete_run(runs[1].info.run_id)
    gc = run_cli(["gc", "--workdir", str(work), "--apply"], prefect_env)
    assert f"removing {manifests[1].parent.relative_to(work)}" in gc.stdout
    assert not manifests[1].parent.exists()
    for run in _data_runs(work):
        if run.info.lifecycle_stage == "active":
            assert shard_paths(Path(run.data.tags["llmforge.manifest"]))
