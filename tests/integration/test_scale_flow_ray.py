"""`llmforge scale` with its runs on a real two-node Ray cluster (tests/helpers/ray_cluster.py) measures the same
points, fits the same law and predicts the same run as one launch training them one after another here.

Every rank trains on one thread in both (runs.threads, the default), so each point's losses depend on its config
alone and must agree to the bit; the fit and its bootstrap are seeded functions of the points."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run_cli
from tests.helpers import seeds
from tests.helpers.ray_cluster import cli_env, ray_cluster  # noqa: F401 - the fixture

pytest.importorskip("ray")
pytest.importorskip("prefect_ray")

# Two budgets of four sizes (depths 1-4 of the tiny family on a 1,024-token vocabulary): enough to fit, then the run
# at 4x the larger budget is predicted and trained. Each point is a few seconds of training.
SWEEP = ["tokenizer.vocab_size=1024", "data.mix.total=400000", "scale.budgets=[4e9,8e9]", "scale.depths=[1,2,3,4]",
         "scale.sizes_per_budget=4", "scale.min_steps=20", "scale.resamples=50"]
small_stage_seed = seeds.small_stage_seed


def sweep_of(work) -> tuple[list[dict], dict | None, str]:
    folder = work / "scale" / "latest"
    prediction = folder / "prediction.json"
    return (json.loads((folder / "points.json").read_text()),
            json.loads(prediction.read_text()) if prediction.is_file() else None, (folder / "report.md").read_text())


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sweep_on_a_two_node_ray_cluster_matches_the_sequential_run(tmp_path, prefect_env, ray_cluster,
                                                                    small_stage_seed):
    address, ray_env = ray_cluster
    env = cli_env(prefect_env, ray_env)
    sets = [a for kv in SWEEP for a in ("--set", kv)]
    here = seeds.seed_workspace(small_stage_seed, tmp_path / "here")
    run_cli(["scale", "--preset", "tiny", "--workdir", str(here), *sets, "--set", "runs.slots=1"], env, timeout=1200)
    there = seeds.seed_workspace(small_stage_seed, tmp_path / "ray")
    on_ray = run_cli(["scale", "--preset", "tiny", "--workdir", str(there), *sets, "--set", "runs.executor=ray",
                      "--set", f"runs.ray_address={address}"], env, timeout=1200)
    out = on_ray.stdout + on_ray.stderr
    assert "2 node(s) see the workspace" in out, out[-3000:]
    # Ray's 4 CPUs, one per run: the 8 points in 4 launches side by side, then the predicted run alone.
    assert "8 run(s) to train in 4 launch(es) side by side on Ray" in out, out[-3000:]
    nodes = set(re.findall(r"a launch ran on Ray node (\S+)", out))
    assert len(nodes) == 2, out[-3000:]  # spread over both nodes

    points_here, prediction_here, _ = sweep_of(here)
    points_ray, prediction_ray, report = sweep_of(there)
    key = ("depth", "budget", "steps", "tokens", "final_val_bpb", "final_val_loss")
    assert [[p[k] for k in key] for p in points_ray] == [[p[k] for k in key] for p in points_here]
    assert (prediction_ray is None) == (prediction_here is None), report
    if prediction_here is not None:
        for k in ("depth", "predicted_bpb", "interval", "measured_bpb"):
            assert prediction_ray[k] == prediction_here[k], k
