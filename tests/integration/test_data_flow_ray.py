"""The data flow on a real two-node Ray cluster gives the local executor's funnel and shards.

The cluster is started as a user would (`ray start --head`, then `ray start --address` for a
second node), both nodes on loopback addresses of this machine (Ray turns 127.0.0.1 into the
machine's network address, but keeps 127.0.0.2). Near dedup is given several small batches
and two workers, so its signature jobs run as Ray tasks spread over both nodes.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from infra.lifecycle.process_tree import stop_processes
from tests.conftest import run_cli
from tests.helpers.data_flow import make_preset

pytest.importorskip("ray")
pytest.importorskip("prefect_ray")

HEAD_IP = "127.0.0.2"
RAY = str(Path(sys.executable).with_name("ray"))
OVERRIDES = ["--set", "data.near.workers=2", "--set", "data.near.batch_size=4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_processes(temp_dir: str) -> list[psutil.Process]:
    """The processes of the cluster whose session lives in `temp_dir`, with their children."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        if temp_dir in " ".join(p.info["cmdline"] or []):
            found[p.pid] = p
            for c in p.children(recursive=True):
                found[c.pid] = c
    return list(found.values())


@pytest.fixture
def ray_cluster(isolated_env):
    """A head node and a worker node of two CPUs each; yields (address, env); stopped afterwards."""
    # Short: Ray's unix sockets live under it, and a socket path has at most 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**isolated_env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    address = f"{HEAD_IP}:{port}"
    common = ["--num-cpus=2", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--node-ip-address={HEAD_IP}", f"--port={port}",
                        f"--ray-client-server-port={free_port()}", "--include-dashboard=false", *common],
                       env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([RAY, "start", f"--address={address}", *common], env=env, check=True, capture_output=True, timeout=120)
        yield address, env
    finally:
        stop_processes(ray_processes(temp_dir), grace_s=5.0)
        shutil.rmtree(temp_dir, ignore_errors=True)


def shards_and_funnel(work: Path) -> tuple[list[tuple[str, str]], dict]:
    manifest = json.loads((work / "data" / "shards" / "latest" / "manifest.json").read_text())
    return [(s["file"], s["sha256"]) for s in manifest["shards"]], manifest["funnel"]


@pytest.mark.slow
def test_data_flow_on_a_two_node_ray_cluster_matches_local(tmp_path, prefect_env, ray_cluster):
    address, ray_env = ray_cluster
    preset = make_preset(tmp_path, "  near:\n    threshold: 0.7\n")
    env = {**prefect_env, **{k: ray_env[k] for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}}

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
