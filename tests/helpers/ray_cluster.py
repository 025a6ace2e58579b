"""A real two-node Ray cluster on this machine, started as a user would (`ray start --head`, then `ray start
--address` for a second node), both nodes on loopback addresses (Ray turns 127.0.0.1 into the machine's network
address, but keeps 127.0.0.2). A test module uses it by importing `ray_cluster`."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from infra.lifecycle.process_tree import stop_processes

HEAD_IP = "127.0.0.2"
RAY = str(Path(sys.executable).with_name("ray"))


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


def cli_env(prefect_env: dict[str, str], cluster_env: dict[str, str]) -> dict[str, str]:
    """A CLI run's environment beside the cluster: the test's, with Ray's settings of the cluster."""
    return {**prefect_env, **{k: cluster_env[k] for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}}
