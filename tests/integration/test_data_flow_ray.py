"""The data flow on a real two-node Ray cluster gives the local executor's funnel and shards.

The cluster is started as a user would (tests/helpers/ray_cluster.py). Near dedup is given several small batches
and two workers, so its signature jobs run as Ray tasks spread over both nodes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers.data_flow import make_preset
from tests.helpers.ray_cluster import cli_env, ray_cluster  # noqa: F401 - the fixture

pytest.importorskip("ray")
pytest.importorskip("prefect_ray")

OVERRIDES = ["--set", "data.near.workers=2", "--set", "data.near.batch_size=4"]


def shards_and_funnel(work: Path) -> tuple[list[tuple[str, str]], dict]:
    manifest = json.loads((work / "data" / "shards" / "latest" / "manifest.json").read_text())
    return [(s["file"], s["sha256"]) for s in manifest["shards"]], manifest["funnel"]


@pytest.mark.slow
def test_data_flow_on_a_two_node_ray_cluster_matches_local(tmp_path, prefect_env, ray_cluster):
    address, ray_env = ray_cluster
    preset = make_preset(tmp_path, "  near:\n    threshold: 0.7\n")
    env = cli_env(prefect_env, ray_env)

    run_cli(["data", "--preset", str(preset), "--workdir", str(tmp_path / "local"), *OVERRIDES], env)
    on_ray = run_cli(["data", "--preset", str(preset), "--workdir", str(tmp_path / "ray"), *OVERRIDES,
                      "--set", "data.executor=ray", "--set", f"data.ray_address={address}"], env)
    out = on_ray.stdout + on_ray.stderr
    assert "2 node(s) see the workspace" in out
    spread = [line for line in out.splitlines() if "job(s) on Ray nodes" in line]
    assert spread, out[-3000:]
    nodes = json.loads(spread[0].split("Ray nodes ", 1)[1].replace("'", '"'))
    # Every signature job beyond the measuring ones ran as a Ray task (where, Ray's SPREAD decides;
    # that both nodes run the project's code is what the workspace check above shows).
    assert sum(nodes.values()) >= 4, nodes

    local_shards, local_funnel = shards_and_funnel(tmp_path / "local")
    ray_shards, ray_funnel = shards_and_funnel(tmp_path / "ray")
    assert ray_funnel == local_funnel
    assert ray_shards == local_shards  # byte-identical shards
    assert ray_funnel["news"]["near_duplicates"] == 1


def test_unknown_executor_is_refused():
    from pydantic import ValidationError

    from flows.config import DataConfig

    with pytest.raises(ValidationError, match="executor"):
        DataConfig(executor="dask")
