"""End to end: `llmforge scale` through the real flow, DeepSpeed launcher and MLflow on a 2-point sweep, then a
rerun that trains nothing. Two points cannot be fitted: the flow says so and writes no prediction (the fits and
the prediction are tested on synthetic sweeps in tests/unit/training/test_scaling_sweep.py)."""
from __future__ import annotations

import hashlib
import json

import pytest

from tests.conftest import run_cli
from tests.helpers import seeds
from tests.helpers.flow_runs import parent_and_children

# One budget, depths 1 and 2 of the tiny family on a 1,024-token vocabulary: 53 and 16 optimizer steps of 4
# sequences, and depth 2, short of min_steps, on 2 sequences instead (32 steps).
TWO_POINTS = ["tokenizer.vocab_size=1024", "data.mix.total=400000", "scale.budgets=[4e9]", "scale.depths=[1,2]",
              "scale.sizes_per_budget=2", "scale.min_steps=20", "pretrain.log.every=1"]
small_stage_seed = seeds.small_stage_seed  # its data, tokenizer and tokens: the same keys as TWO_POINTS'


@pytest.mark.slow
@pytest.mark.timeout(3600)  # measured 22 minutes on the 2-core machine at load 15-25 (idle: a few, estimated)
def test_two_point_sweep_tracked_and_cached(tmp_path, prefect_env, small_stage_seed):
    work = seeds.seed_workspace(small_stage_seed, tmp_path / "work")
    args = ["scale", "--preset", "tiny", "--workdir", str(work)] + [a for kv in TWO_POINTS for a in ("--set", kv)]
    first = run_cli(args, prefect_env, timeout=1800)
    log = first.stdout + first.stderr
    for name in ("write_shards", "train_tokenizer", "tokenize_shards"):  # the seed's stages, reused
        assert f"stage {name}: reused" in log, (name, log[-3000:])
    assert "point 1/2 at C=4e+09: depth 1" in log and "point 2/2 at C=4e+09: depth 2" in log
    assert "no fit: sizes per budget {'4e+09': 2}" in log

    folder = work / "scale" / "latest"
    points = json.loads((folder / "points.json").read_text())
    assert [p["depth"] for p in points] == [1, 2] and [p["steps"] for p in points] == [53, 32]
    # On the sweep's own micro-batch (scale.micro_batch_size: 4 sequences of 128), not pretraining's 16; depth 2,
    # short of scale.min_steps on 4, on 2.
    assert [p["micro_batch_size"] for p in points] == [None, 2] and all(p["final_val_bpb"] > 0 for p in points)
    assert [p["tokens"] for p in points] == [53 * 4 * 128, 32 * 2 * 128]
    assert not (folder / "prediction.json").exists()
    report = (folder / "report.md").read_text()
    assert "Not fitted:" in report and (folder / "isoflop.png").stat().st_size > 1000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    parent, children = parent_and_children(work, "scale")
    sweep = [parent]
    assert sorted(int(r.data.params["depth"]) for r in children) == [1, 2]
    manifest = (work / "data" / "shards" / "latest" / "manifest.json").resolve()  # the seed's shards, copied here
    for child in children:
        # Each point names the shards it trained on, through the record of the tokens it read.
        (shards,) = client.get_run(child.info.run_id).inputs.dataset_inputs
        assert shards.dataset.name == "pretraining-shards" and json.loads(shards.dataset.source)["uri"] == manifest.as_uri()
        assert shards.dataset.digest == hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
        assert {t.key: t.value for t in shards.tags}["mlflow.data.context"] == "training"
        point = next(p for p in points if p["mlflow_run_id"] == child.info.run_id)
        assert int(child.data.params["n_params"]) == point["n_params"] and int(child.data.params["tokens"]) == point["tokens"]
        assert float(child.data.params["flops"]) == pytest.approx(point["flops"], rel=1e-5)
        assert child.data.metrics["final_val_bpb"] == pytest.approx(point["final_val_bpb"])
        assert child.data.metrics["final_val_loss"] == pytest.approx(point["final_val_loss"])
    artifacts = {a.path for a in client.list_artifacts(sweep[0].info.run_id, "scale")}
    assert {"scale/report.md", "scale/points.json"} <= artifacts

    # Rerun: both points are reused from their verified folders; nothing is launched.
    second = run_cli(args, prefect_env, timeout=1800)
    log = second.stdout + second.stderr
    assert sum("stage pretrain: reused" in line for line in log.splitlines()) == 2, log[-3000:]
    assert "launching:" not in log
    assert "report: " in log and "MLflow run: " in log  # the CLI ends saying where to look
