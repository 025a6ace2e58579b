"""Prefect deployments: infra/prefect.yaml, the service scripts, and a real deployed run.

The slow tests start a real Prefect server (on a free, non-default PORT) and a real
`process` worker through infra/scripts/, register the deployments with deploy.sh, run the
docs/deployments.md's sequence (`prefect deployment run ... -p overrides=[...] --watch`: data-tiny with
and without an override, pipeline-tiny with its budgets cut), check the runs in Prefect
and MLflow, and screenshot the Prefect UI with headless Chromium when it is installed.

The pipeline-tiny run is also the suite's one fresh end-to-end pipeline: its report, MLflow
runs and registered model are checked here, and a second pipeline-tiny run with the same
overrides must reuse every stage, launch nothing and be tagged a repeat of the first.
"""
from __future__ import annotations

import json
import os
import re
import shutil
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
from tests.helpers import seeds
from tests.helpers.data_flow import make_catalog
from tests.helpers.seeds import SMALL, seed_workspace

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
    expected = ["pipeline-tiny", "data-tiny", "scale-tiny", "ablate-tiny", "mix-tiny"]
    assert {d.name for d in model.deployments} >= set(expected)
    for name in expected:
        dep = deployment(name)
        assert dep.work_pool.name == POOL
        assert dep.schedules and all(s.active is False for s in dep.schedules), "example schedules must be inactive"
        # Deployments name a preset instead of copying it, so they cannot drift from it.
        assert "config" not in dep.parameters and load_pipeline_config(dep.parameters["preset"]) == tiny
        # No workdir: runs follow the worker's LLMFORGE_HOME, like the server and MLflow scripts.
        assert "workdir" not in dep.parameters
        # The server validates run parameters against this schema (enforce_parameter_schema).
        flow = load_flow_from_entrypoint(str(ROOT / dep.entrypoint), use_placeholder_flow=False)
        schema = parameter_schema(flow).model_dump_for_openapi()
        validate(dep.parameters, schema, raise_on_error=True)
        if "config" in schema["properties"]:  # a flow that takes a config (not the ablation: it takes a file)
            with pytest.raises(ValidationError, match="not_a_key"):
                validate({**dep.parameters, "config": {"not_a_key": 1}}, schema, raise_on_error=True)
        validate({**dep.parameters, "overrides": ["data.near.threshold=0.7"]}, schema, raise_on_error=True)


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


# The pipeline deployment with every stage's budget cut to a few steps.
SMALL_PIPELINE = SMALL + ["name=deployed-small"]
small_stage_seed = seeds.small_stage_seed  # the session's data/tokenizer/tokens seed (tests/helpers/seeds.py)


def deployment_run(name: str, env: dict[str, str], *params: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`prefect deployment run <name> -p ... --watch`, as docs/deployments.md writes it."""
    cmd = [PREFECT, "deployment", "run", name, *[a for p in params for a in ("-p", p)], "--watch", "--watch-timeout", str(int(timeout))]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 60)


def flow_runs(api: str, deployment_id: str) -> list[dict]:
    runs = httpx.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}},
                                                      "sort": "EXPECTED_START_TIME_ASC"}, timeout=10).json()
    return runs


def api_call(method: str, url: str, **kwargs) -> httpx.Response:
    """One API request, retried for a minute while the server answers 429/502/503 or not at all (a loaded
    server's SQLite times out), as Prefect's own client retries."""
    deadline = time.monotonic() + 60
    while True:
        try:
            response = httpx.request(method, url, timeout=30, **kwargs)
            if response.status_code not in (429, 502, 503) or time.monotonic() > deadline:
                return response
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(2)


def run_through_api(api: str, deployment: str, parameters: dict, timeout: float) -> dict:
    """A run of `deployment` created through the API (what `prefect deployment run` does, without its CLI's
    start-up), once the worker has finished it: the flow run as the API returns it."""
    dep = api_call("GET", f"{api}/deployments/name/{deployment}").json()
    # The key makes a retried request return the run the first one created.
    created = api_call("POST", f"{api}/deployments/{dep['id']}/create_flow_run",
                       json={"parameters": parameters, "idempotency_key": f"test-rerun-{time.time()}"})
    assert created.status_code in (200, 201), created.text
    deadline = time.monotonic() + timeout
    while True:
        flow_run = api_call("GET", f"{api}/flow_runs/{created.json()['id']}").json()
        if flow_run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return flow_run
        assert time.monotonic() < deadline, f"{deployment} run {flow_run['name']} still {flow_run['state_type']}"
        time.sleep(2)


def worker_output(logs: Path, start: int, flow_run_name: str, timeout: float = 60) -> str:
    """The worker's log from byte `start` on, once it holds the end of flow run `flow_run_name` (the worker
    copies a flow run's output, which can lag behind the run's state)."""
    deadline = time.monotonic() + timeout
    while True:
        text = (logs / "worker.log").read_bytes()[start:].decode("utf-8", "replace")
        if f"Flow run '{flow_run_name}' - Finished in state" in text or time.monotonic() > deadline:
            return text
        time.sleep(1)


def test_worker_without_server_fails_in_one_line_naming_the_url(isolated_env):
    port = free_port()
    env = {**isolated_env, "PORT": str(port), "LLMFORGE_VENV": sys.prefix}
    for script in ("start_prefect_worker.sh", "deploy.sh"):
        out = subprocess.run([str(SCRIPTS / script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        lines = (out.stdout + out.stderr).strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, (script, lines)
        assert f"http://127.0.0.1:{port}/api/health" in lines[0] and f"PORT={port} infra/scripts/start_prefect_server.sh" in lines[0]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, request) -> Iterator[dict]:
    """docs/deployments.md's sequence on a non-default PORT: server, worker, deploy.sh, then the runs it shows.

    Runs: data-tiny as deployed, data-tiny with an override (plus a tiny catalog), a bad override,
    and pipeline-tiny with its budgets cut by overrides, then pipeline-tiny again with the same
    overrides (through the API), which must reuse every stage. Every script gets only PORT, no API URL.
    The workspace starts with the session seed's data, tokenizer and token stages (not its MLflow
    store): the runs reuse those and still train, evaluate, log and register everything themselves.
    """
    tmp = tmp_path_factory.mktemp("deployed")
    logs = tmp / "logs"
    logs.mkdir()
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    work = tmp / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "LLMFORGE_"))}
    env.update(
        PORT=str(port), LLMFORGE_HOME=str(work), LLMFORGE_VENV=sys.prefix, DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1",
        PREFECT_HOME=str(tmp / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_WORKER_QUERY_SECONDS="2",  # pick runs up quickly
    )
    services = Services(logs)
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        server = services.start("server", [str(SCRIPTS / "start_prefect_server.sh")], env)
        wait_for("the Prefect API at " + api, lambda: httpx.get(f"{api}/health", timeout=5).json() is True,
                 timeout=240, alive=lambda: services.alive("server", server))
        timings["server_up"] = time.monotonic() - started
        worker = services.start("worker", [str(SCRIPTS / "start_prefect_worker.sh")], env)
        wait_for(f"work pool {POOL}", lambda: httpx.get(f"{api}/work_pools/{POOL}", timeout=5).status_code == 200,
                 timeout=120, alive=lambda: services.alive("worker", worker))
        run([str(SCRIPTS / "deploy.sh")], env, timeout=240)  # --all: every deployment must load and register
        timings["deployed"] = time.monotonic() - started
        seed_workspace(request.getfixturevalue("small_stage_seed"), work)
        timings["seeded"] = time.monotonic() - started

        client_env = {**env, "PREFECT_API_URL": api}  # docs/deployments.md's `export PREFECT_API_URL=...`
        catalog = make_catalog(tmp)
        results = {
            "data": deployment_run("data/data-tiny", client_env),
            "data_override": deployment_run("data/data-tiny", client_env, f'overrides={json.dumps(["data.near.threshold=0.7", f"data.catalog={catalog}"])}'),
            "bad_override": deployment_run("data/data-tiny", client_env, 'overrides=["data.near.treshold=0.7"]', timeout=240),
        }
        timings["data_runs"] = time.monotonic() - started
        log_start = (logs / "worker.log").stat().st_size
        results["pipeline"] = deployment_run("pipeline/pipeline-tiny", client_env, f"overrides={json.dumps(SMALL_PIPELINE)}", timeout=1800)
        timings["pipeline_run"] = time.monotonic() - started
        pipe_dep = httpx.get(f"{api}/deployments/name/pipeline/pipeline-tiny", timeout=10).json()
        first_log = worker_output(logs, log_start, flow_runs(api, pipe_dep["id"])[0]["name"])
        # The same run again: every stage's inputs, config and code are unchanged (not worth waiting for
        # when the first run failed: the test fails on that first).
        rerun_started, rerun_log_start = time.time(), (logs / "worker.log").stat().st_size
        rerun, rerun_log = None, ""
        if results["pipeline"].returncode == 0:
            rerun = run_through_api(api, "pipeline/pipeline-tiny", {"overrides": SMALL_PIPELINE}, timeout=900)
            rerun_log = worker_output(logs, rerun_log_start, rerun["name"])
            timings["pipeline_rerun"] = time.monotonic() - started
        services.alive("worker", worker)
        services.alive("server", server)
        yield {"api": api, "port": port, "work": work, "results": results, "services": services, "tmp": tmp, "catalog": catalog,
               "first_log": first_log, "rerun": rerun, "rerun_started": rerun_started, "rerun_log": rerun_log}
    finally:
        print("deployment test timings (s):", {k: round(v, 1) for k, v in timings.items()})
        leftovers = services.stop_all()
        assert not leftovers, f"processes survived teardown: {leftovers}"


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the fixture: 604 s measured with `-n 2` (before the rerun); 23 min at load 15
def test_readme_deployment_sequence_on_another_port(deployed):
    api, work, results, services = deployed["api"], deployed["work"], deployed["results"], deployed["services"]
    port = deployed["port"]
    # The UI calls the API on the server's own port, not on 4200.
    ui = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()
    assert ui["api_url"] == api

    for name in ("data", "data_override", "pipeline"):
        out = results[name]
        assert out.returncode == 0 and "Flow run finished successfully in 'Completed'" in out.stdout, (
            name, out.stdout[-3000:], out.stderr[-2000:], services.log("worker"))
    bad = results["bad_override"]
    assert bad.returncode != 0, bad.stdout[-2000:]

    data_dep = httpx.get(f"{api}/deployments/name/data/data-tiny", timeout=10).json()
    assert data_dep["work_pool_name"] == POOL and data_dep["enforce_parameter_schema"]
    assert data_dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == ROOT_PLACEHOLDER
    assert data_dep["schedules"] and not any(s["active"] for s in data_dep["schedules"])
    assert "workdir" not in data_dep["parameters"]
    data_runs = flow_runs(api, data_dep["id"])
    assert [r["state_type"] for r in data_runs] == ["COMPLETED", "COMPLETED", "FAILED"]
    # The bad key is named in the failed run's logs, as `llmforge --set` names it.
    logs = httpx.post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [data_runs[2]["id"]]}}}, timeout=10).json()
    assert any("key 'data.near.treshold'" in entry["message"] for entry in logs), [e["message"][:200] for e in logs]
    # ... and in the failed run's state message, which `prefect flow-run inspect` and the UI show beside `Failed`.
    assert "data.near.treshold" in (data_runs[2]["state"]["message"] or ""), data_runs[2]["state"]
    pipe_dep = httpx.get(f"{api}/deployments/name/pipeline/pipeline-tiny", timeout=10).json()
    assert [r["state_type"] for r in flow_runs(api, pipe_dep["id"])] == ["COMPLETED", "COMPLETED"]  # the run, its rerun

    # Every run logged into the worker's LLMFORGE_HOME, none into the checkout's work/.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("llmforge")
    assert exp is not None and exp.artifact_location == (work / "mlartifacts").as_uri()
    every_run = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    runs = [r for r in every_run if r.info.start_time < deployed["rerun_started"] * 1000]  # before the rerun
    stage = {r.info.run_id: r.data.tags.get("llmforge.stage") for r in every_run}  # run names also list the overrides
    data = [r for r in runs if stage[r.info.run_id] == "data"]
    assert len(data) == 3 and all(r.info.status == "FINISHED" for r in data)  # 2 deployed + the pipeline's
    # As deployed: the preset's threshold; with the override: 0.7 and the other keys still the preset's.
    assert data[0].data.params["data.near.threshold"] == "0.8" and data[1].data.params["data.near.threshold"] == "0.7"
    assert data[1].data.params["data.near.num_perm"] == data[0].data.params["data.near.num_perm"] == "128"
    assert data[1].data.params["data.catalog"] == str(deployed["catalog"])
    m = data[1].data.metrics
    assert (m["funnel.news.collected"], m["funnel.news.rejected"], m["funnel.news.exact_duplicates"]) == (19, 4, 1)
    (pipeline,) = [r for r in runs if stage[r.info.run_id] == "pipeline"]
    assert pipeline.info.status == "FINISHED" and pipeline.data.params["name"] == "deployed-small"
    children = {stage[r.info.run_id] for r in runs if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id}
    assert {"data", "pretrain", "sft", "grpo", "evaluate"} <= children
    report_files = {a.path for a in client.list_artifacts(pipeline.info.run_id, "report")}
    assert {"report/report.md", "report/report.html"} <= report_files
    page = Path(client.download_artifacts(pipeline.info.run_id, "report/report.html", str(deployed["tmp"])))
    assert page.read_text().count('src="data:image/png;base64,') >= 3
    assert "pipeline wall time" in page.read_text()
    assert (work / "reports" / "attempts.json").is_file()

    # One Prefect artifact per stage and run, each holding the whole table.
    arts = httpx.post(f"{api}/artifacts/filter", json={}, timeout=10).json()
    keys = [a["key"] for a in arts if a["key"]]
    # Stable keys: the data runs (3, and the rerun's) are versions of one artifact (its history in Prefect's UI).
    assert keys.count("data-funnel") == 4 and keys.count("pipeline-report") == 2, keys
    report_art = next(a for a in arts if a["key"] == "pipeline-report")
    assert "data:image/png;base64," in report_art["data"]  # the figures, inlined (the UI shows them)
    for art in arts:
        if art["key"] in ("data-funnel", "pipeline-report"):
            # Wide tables are transposed: the artifact panel clips columns, never rows.
            assert "| sampled_rows |" in art["data"], art["key"]
            assert max(line.count("|") for line in art["data"].splitlines()) <= 8, art["key"]
    # The headline's long labels would push their values out of the panel: a list instead, which wraps.
    assert "\n- pipeline wall time: " in report_art["data"], report_art["data"][:3000]

    check_pipeline_run_and_its_rerun(deployed, client, exp, pipeline)


def check_pipeline_run_and_its_rerun(deployed: dict, client, exp, parent) -> None:
    """The fresh pipeline run (SMALL, through the deployment): tracked, reported and registered; the rerun with
    the same overrides reuses every stage, launches nothing and is a repeat of it.

    A part of test_readme_deployment_sequence_on_another_port rather than a test of its own: a third test on
    `deployed` could be stolen by the other xdist worker, which would then build the whole fixture again.
    """
    work, first_log, rerun_log = deployed["work"], deployed["first_log"], deployed["rerun_log"]
    for k, name in enumerate(("data", "pretrain", "sft", "grpo", "evaluate"), start=1):
        assert f"stage {k}/5 {name}" in first_log, first_log[-3000:]
    assert "launching:" in first_log  # this run trained: the seed holds no model

    # The first run's report: what the run was and what each stage took.
    folder = work / "reports" / parent.info.run_id
    report = (folder / "report.md").read_text()
    assert "held-out arithmetic accuracy SFT → GRPO" in report and "## Calibration" in report
    for row in ("| preset | tiny |", "| overrides (--set) | pretrain.steps=6 ", "| git commit | ", "| machine | ",
                "| packages | python ", "| stage | wall time | this run |", "| pretrain | ", "| evaluate | "):
        assert row in report, (row, report[:2500])
    # `precision: auto` picks by measuring this CPU (bf16 where its bf16 matmuls pay, as on AVX-512 with bf16), and
    # says which and why.
    assert re.search(r"^\| precision, pretrain \| (fp32|bf16) \(auto: .+\) \|$", report, re.M), report[:2500]
    assert "pretrain.steps" in report.split("| differs from the preset |")[1].split("\n")[0]
    for png in ("pretrain_loss.png", "sft_loss.png", "calibration_comparison.png"):
        assert (folder / png).stat().st_size > 1000

    runs = client.search_runs([exp.experiment_id])
    stage_of = {r.info.run_id: r.data.tags.get("llmforge.stage") for r in runs}  # names also list the overrides
    assert parent.info.run_name.startswith("pipeline pretrain.steps=6")
    pre = next(r for r in runs if stage_of[r.info.run_id] == "pretrain")
    assert "unigram_ppl" in pre.data.metrics and client.get_metric_history(pre.info.run_id, "loss")
    versions = client.search_model_versions("name='llmforge-tiny'")
    assert len(versions) == 1  # after the rerun too: the same weights are not registered twice
    assert versions[0].tags["pipeline_run_id"] == parent.info.run_id and len(versions[0].tags["manifest_sha256"]) == 64
    assert versions[0].tags["llmforge.preset"] == "tiny" and versions[0].tags["llmforge.precision.grpo"].startswith("fp32")
    assert "champion: the first version" in versions[0].description and "preset `tiny`" in versions[0].description
    # The parent run: what it was (params, tags, description), every stage's headline metrics, only config as params.
    top = client.get_run(parent.info.run_id).data
    assert top.params["run.preset"] == "tiny" and top.params["run.overrides"].startswith("pretrain.steps=6")
    assert top.tags["llmforge.git_commit"] and top.tags["llmforge.machine"] and "torch" in top.tags["llmforge.versions"]
    assert top.tags["mlflow.note.content"].startswith("preset `tiny`, changed: ")
    assert {"data/kept", "pretrain/final_val_ppl", "grpo/heldout_accuracy_after", "pipeline/wall_minutes",
            "pretrain/wall_minutes", "evaluate/grpo.token.ece"} <= set(top.metrics), sorted(top.metrics)
    assert not {"do_sample", "max_new_tokens", "return_full_text"} & set(top.params)
    data_run = next(r for r in runs if stage_of[r.info.run_id] == "data"
                    and r.data.tags.get("mlflow.parentRunId") == parent.info.run_id)
    assert "data.near.threshold" in data_run.data.params and "near.threshold" not in data_run.data.params
    assert "mix.total" in data_run.data.tags["mlflow.note.content"]  # what this stage's config changed

    # The rerun: every stage's inputs and config are unchanged, so no training runs again.
    rerun = deployed["rerun"]
    assert rerun is not None and rerun["state_type"] == "COMPLETED", (rerun and rerun["state"], rerun_log[-3000:])
    for name in ("train_tokenizer", "tokenize_shards", "pretrain", "sft", "grpo", "evaluate"):
        assert any(f"stage {name}: reused" in line for line in rerun_log.splitlines()), (name, rerun_log[-3000:])
    assert "launching:" not in rerun_log  # no DeepSpeed launch on the rerun
    # It is a repeat of the first pipeline run and says so, with every stage output reused.
    pipelines = [r for r in runs if stage_of[r.info.run_id] == "pipeline"]
    assert len(pipelines) == 2
    repeat = next(r for r in pipelines if r.info.run_id != parent.info.run_id)
    assert repeat.data.tags["llmforge.repeat_of"] == parent.info.run_id
    # The report says the stages were reused, with their own wall times.
    again = (work / "reports" / "latest" / "report.md").read_text()
    assert "reused 5 of 5 stages (data, pretrain, sft, grpo, evaluate) from earlier runs" in again, again[:3000]
    assert repeat.data.metrics["pipeline/stages_reused"] == 5
    assert repeat.data.metrics["pretrain/wall_minutes"] == top.metrics["pretrain/wall_minutes"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(url: str, out: Path, height: int = 1400) -> Path:
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size=1400,{height}", "--virtual-time-budget=20000", f"--screenshot={out}", url],
                   capture_output=True, text=True, timeout=120)
    assert out.is_file() and out.stat().st_size > 10_000, f"no screenshot of {url}"
    return out


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_prefect_ui_shows_the_deployed_runs_and_report(deployed):
    # A marker, not pytest.skip() in the body: the `deployed` fixture (10 minutes) is not set up for a skip.
    api, port = deployed["api"], deployed["port"]
    shots = Path(os.environ.get("LLMFORGE_SCREENSHOTS") or deployed["tmp"] / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    pipe_dep = httpx.get(f"{api}/deployments/name/pipeline/pipeline-tiny", timeout=10).json()
    run_ = flow_runs(api, pipe_dep["id"])[0]  # the fresh run (the second reused its stages)
    arts = httpx.post(f"{api}/artifacts/filter", json={}, timeout=10).json()
    report = next(a for a in arts if a["key"] == "pipeline-report")
    funnel = max((a for a in arts if a["key"] == "data-funnel"), key=lambda a: a["created"])
    base = f"http://127.0.0.1:{port}"
    for name, url in [("flow_run", f"{base}/runs/flow-run/{run_['id']}"),
                      ("report_artifact", f"{base}/artifacts/artifact/{report['id']}"),
                      ("funnel_artifact", f"{base}/artifacts/artifact/{funnel['id']}")]:
        png = screenshot(url, shots / f"{name}.png", height=5200 if name == "report_artifact" else 1400)
        print(f"screenshot: {png}")
    # A page that failed to reach its API renders the same blank error card everywhere; a
    # rendered run page differs from a rendered artifact page.
    assert (shots / "flow_run.png").read_bytes() != (shots / "report_artifact.png").read_bytes()


@pytest.mark.slow
def test_mlflow_server_script_shows_workspace_runs_and_artifacts(tmp_path, isolated_env, services):
    from infra.tracking.runs import log_artifact, stage_run
    from infra.workspace.paths import Workspace

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
