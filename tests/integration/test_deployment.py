"""Prefect deployments: infra/prefect.yaml, the service scripts, and a real deployed run.

The slow test starts a real Prefect server and a real `process` worker through
infra/scripts/, registers the data deployment with `prefect deploy`, runs it with
`prefect deployment run ... -p config=<JSON> --watch` and checks the run in MLflow.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.conftest import ROOT
from .test_data_flow import make_catalog

SCRIPTS = ROOT / "infra" / "scripts"
PREFECT_YAML = ROOT / "infra" / "prefect.yaml"
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "llmforge-local"
ROOT_PLACEHOLDER = "{{ $LLMFORGE_ROOT }}"


def load_prefect_yaml():
    from prefect.cli.deploy._models import PrefectYamlModel

    # `prefect deploy` only warns and skips a file that fails this model, so check it here.
    return PrefectYamlModel.model_validate(yaml.safe_load(PREFECT_YAML.read_text()))


def deployment(name: str):
    found = [d for d in load_prefect_yaml().deployments if d.name == name]
    assert len(found) == 1, f"infra/prefect.yaml must define exactly one deployment named {name!r}"
    return found[0]


def test_prefect_yaml_deployments_match_flows_and_tiny_preset():
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import ValidationError, validate

    from flows.config import load_pipeline_config

    model = load_prefect_yaml()
    assert not model.build and not model.push
    assert model.pull == [{"prefect.deployments.steps.set_working_directory": {"directory": ROOT_PLACEHOLDER}}]
    tiny = load_pipeline_config("tiny")
    expected = ["pipeline-tiny", "data-tiny"]
    assert {d.name for d in model.deployments} >= set(expected)
    for name in expected:
        dep = deployment(name)
        assert dep.work_pool.name == POOL
        assert dep.schedules and all(s.active is False for s in dep.schedules), "example schedules must be inactive"
        # Deployments name a preset instead of copying it, so they cannot drift from it.
        assert "config" not in dep.parameters and load_pipeline_config(dep.parameters["preset"]) == tiny
        # The server validates run parameters against this schema (enforce_parameter_schema).
        flow = load_flow_from_entrypoint(str(ROOT / dep.entrypoint), use_placeholder_flow=False)
        schema = parameter_schema(flow).model_dump_for_openapi()
        validate(dep.parameters, schema, raise_on_error=True)
        with pytest.raises(ValidationError, match="not_a_key"):
            validate({**dep.parameters, "config": {"not_a_key": 1}}, schema, raise_on_error=True)


@pytest.mark.parametrize("script", ["start_prefect_server.sh", "start_prefect_worker.sh", "start_mlflow_server.sh", "deploy.sh"])
def test_scripts_parse_and_print_usage(script):
    path = SCRIPTS / script
    assert os.access(path, os.X_OK), f"{path} must be executable (chmod +x)"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    out = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Usage: infra/scripts/" in out.stdout, out.stdout + out.stderr
    assert "set -euo pipefail" in path.read_text()


# ---------------------------------------------------------------- live server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Services:
    """Background processes, each in its own session so its whole tree can be stopped."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def alive(self, name: str, proc: subprocess.Popen) -> None:
        assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{self.log(name)}"

    def stop_all(self) -> list[str]:
        """Stop in reverse start order (worker before server); returns processes that survived."""
        leftovers: list[str] = []
        for name, proc in reversed(self.procs):
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                tree = []
            # SIGINT is what stops a Prefect worker promptly (it may ignore SIGTERM while it retries).
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                for p in tree:
                    try:
                        p.send_signal(sig)
                    except psutil.NoSuchProcess:
                        pass
                _, tree = psutil.wait_procs(tree, timeout=15 if sig != signal.SIGKILL else 5)
                if not tree:
                    break
            leftovers += [f"{name}: pid {p.pid}" for p in tree]
            proc.wait(timeout=5)
        return leftovers


@pytest.fixture
def services(tmp_path) -> Iterator[Services]:
    logs = tmp_path / "logs"
    logs.mkdir()
    svc = Services(logs)
    try:
        yield svc
    finally:
        leftovers = svc.stop_all()
        assert not leftovers, f"processes survived teardown: {leftovers}"


def wait_for(what: str, check, timeout: float, alive=lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive()
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.slow
def test_deployed_data_flow_runs_on_a_process_worker(tmp_path, isolated_env, services):
    started = time.monotonic()
    timings: dict[str, float] = {}
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in isolated_env.items() if k != "LLMFORGE_ROOT"}
    env.update(
        PORT=str(port),
        PREFECT_API_URL=api,
        LLMFORGE_VENV=sys.prefix,  # the scripts use this venv's prefect, wherever it lives
        PREFECT_WORKER_QUERY_SECONDS="2",  # pick the run up quickly
    )

    server = services.start("server", [str(SCRIPTS / "start_prefect_server.sh")], env)
    wait_for("the Prefect API at " + api, lambda: httpx.get(f"{api}/health", timeout=5).json() is True,
             timeout=240, alive=lambda: services.alive("server", server))
    timings["server_up"] = time.monotonic() - started

    # The worker script creates the work pool; it resolves LLMFORGE_ROOT to its own checkout.
    worker = services.start("worker", [str(SCRIPTS / "start_prefect_worker.sh")], env)
    wait_for(f"work pool {POOL}", lambda: httpx.get(f"{api}/work_pools/{POOL}", timeout=5).status_code == 200,
             timeout=120, alive=lambda: services.alive("worker", worker))

    timings["pool_ready"] = time.monotonic() - started
    run([str(SCRIPTS / "deploy.sh")], env, timeout=240)  # --all: every deployment must load and register
    timings["deployed"] = time.monotonic() - started
    assert httpx.get(f"{api}/deployments/name/pipeline/pipeline-tiny", timeout=10).status_code == 200
    dep = httpx.get(f"{api}/deployments/name/data/data-tiny", timeout=10).json()
    assert dep["work_pool_name"] == POOL
    assert dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == ROOT_PLACEHOLDER
    assert dep["schedules"] and not any(s["active"] for s in dep["schedules"])
    assert dep["parameters"]["preset"] == "tiny" and dep["enforce_parameter_schema"]

    # A parameter the flow's pydantic config does not know is refused before any run exists.
    bad = subprocess.run([PREFECT, "deployment", "run", "data/data-tiny", "-p", 'config={"near": {"treshold": 0.7}}'],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "treshold" in bad.stdout + bad.stderr, bad.stdout + bad.stderr

    catalog = make_catalog(tmp_path)
    work = tmp_path / "run-work"
    config = {"catalog": str(catalog), "near": {"threshold": 0.7}, "shards": {"shard_mb": 0.002}}
    watched = run(
        [PREFECT, "deployment", "run", "data/data-tiny", "-p", f"workdir={work}", "-p", f"config={json.dumps(config)}",
         "--watch", "--watch-timeout", "360"],
        env, timeout=420,
    )
    timings["run_done"] = time.monotonic() - started
    assert "Flow run finished successfully in 'Completed'" in watched.stdout, watched.stdout[-3000:] + services.log("worker")
    services.alive("worker", worker)
    services.alive("server", server)

    runs = httpx.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [dep["id"]]}}}, timeout=10).json()
    assert [r["state_type"] for r in runs] == ["COMPLETED"]

    # The run executed in the repository (pull step) and logged to MLflow in the given workdir.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("llmforge")
    assert exp is not None, f"no MLflow experiment in {work}; worker log:\n{services.log('worker')}"
    (mlrun,) = client.search_runs([exp.experiment_id])
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["llmforge.stage"] == "data"
    assert mlrun.data.params["near.threshold"] == "0.7"  # the -p config JSON reached the flow as DataConfig
    m = mlrun.data.metrics
    assert (m["funnel.news.collected"], m["funnel.news.rejected"], m["funnel.news.exact_duplicates"]) == (19, 4, 1)
    assert (m["funnel.letters.collected"], m["funnel.letters.rejected"]) == (5, 1)
    assert m["funnel.news.near_duplicates"] >= 1
    for source in ("news", "letters", "total"):
        parts = ("kept", "rejected", "exact_duplicates", "near_duplicates", "filtered")
        assert m[f"funnel.{source}.collected"] == sum(m[f"funnel.{source}.{p}"] for p in parts), source
    # Artifacts sit in the workspace, where `mlflow ui`/start_mlflow_server.sh find them.
    assert exp.artifact_location == (work / "mlartifacts").as_uri()
    assert "data/manifest.json" in {a.path for a in client.list_artifacts(mlrun.info.run_id, "data")}
    assert (work / "data" / "shards" / "manifest.json").is_file()
    timings["total"] = time.monotonic() - started
    print("deployment test timings (s):", {k: round(v, 1) for k, v in timings.items()})


@pytest.mark.slow
def test_mlflow_server_script_shows_workspace_runs_and_artifacts(tmp_path, isolated_env, services):
    from infra.paths import Workspace
    from infra.tracking import log_artifact, stage_run

    # A run logged the way the flows log it (no MLFLOW_TRACKING_URI: SQLite in the workspace).
    ws = Workspace(tmp_path / "work")
    note = tmp_path / "note.md"
    note.write_text("# hello\n")
    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        with stage_run(ws, "data", {"near": {"threshold": 0.7}}) as logged:
            log_artifact(note, "data")
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved

    port = free_port()
    env = {**isolated_env, "PORT": str(port), "LLMFORGE_HOME": str(ws.root), "LLMFORGE_VENV": sys.prefix, "MLFLOW_WORKERS": "1"}
    server = services.start("mlflow", [str(SCRIPTS / "start_mlflow_server.sh")], env)
    base = f"http://127.0.0.1:{port}"
    wait_for("the MLflow server", lambda: httpx.get(f"{base}/health", timeout=5).status_code == 200,
             timeout=180, alive=lambda: services.alive("mlflow", server))

    exp = httpx.get(f"{base}/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "llmforge"}, timeout=10)
    exp_id = exp.json()["experiment"]["experiment_id"]
    found = httpx.post(f"{base}/api/2.0/mlflow/runs/search", json={"experiment_ids": [exp_id]}, timeout=10).json()
    assert [r["info"]["run_id"] for r in found["runs"]] == [logged.info.run_id]
    listed = httpx.get(f"{base}/ajax-api/2.0/mlflow/artifacts/list",
                       params={"run_uuid": logged.info.run_id, "path": "data"}, timeout=10).json()
    assert [f["path"] for f in listed["files"]] == ["data/note.md"]
    body = httpx.get(f"{base}/get-artifact", params={"run_uuid": logged.info.run_id, "path": "data/note.md"}, timeout=10)
    assert body.status_code == 200 and body.text == "# hello\n"
