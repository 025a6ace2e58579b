"""Prefect or MLflow server down: the CLI stops before any work, naming the (redacted) URL and the fix."""
from __future__ import annotations

import http.server
import threading

import pytest

from flows.cli import main
from infra.config import ConfigError
from infra.launch.launcher import free_port
from infra.lifecycle.preflight import ServiceUnavailable, check_services


@pytest.fixture
def closed_port() -> int:
    return free_port()  # bound and released: nothing listens there


@pytest.fixture
def healthy_server():
    """A real HTTP server on loopback answering GET /api/health and /health with 200."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            ok = self.path in ("/api/health", "/health")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_nothing_configured_checks_nothing():
    assert check_services({}) == []
    assert check_services({"MLFLOW_TRACKING_URI": "sqlite:///x.db", "PREFECT_API_URL": " "}) == []
    with pytest.raises(ConfigError, match="MLflow has no store of scheme 'garbage'"):  # before any work, as for runs
        check_services({"MLFLOW_TRACKING_URI": "garbage://x"})


def test_healthy_servers_pass(healthy_server):
    env = {"PREFECT_API_URL": f"{healthy_server}/api", "MLFLOW_TRACKING_URI": healthy_server}
    assert check_services(env) == [f"{healthy_server}/api", healthy_server]
    with pytest.raises(ServiceUnavailable, match="HTTP 404"):  # reachable but not a Prefect API
        check_services({"PREFECT_API_URL": f"{healthy_server}/elsewhere"})


def test_prefect_down_names_url_and_fix_without_password(closed_port):
    url = f"http://admin:hunter2@127.0.0.1:{closed_port}/api"
    with pytest.raises(ServiceUnavailable) as info:
        check_services({"PREFECT_API_URL": url}, timeout=1.0)
    msg = str(info.value)
    assert f"http://***@127.0.0.1:{closed_port}/api/health" in msg and "hunter2" not in msg
    assert "start_prefect_server.sh" in msg and "unset PREFECT_API_URL" in msg


def test_mlflow_down_names_url_and_fix(closed_port, healthy_server):
    url = f"https://user:s3cret@127.0.0.1:{closed_port}"
    with pytest.raises(ServiceUnavailable) as info:
        check_services({"PREFECT_API_URL": f"{healthy_server}/api", "MLFLOW_TRACKING_URI": url}, timeout=1.0)
    msg = str(info.value)
    assert f"MLflow server at https://***@127.0.0.1:{closed_port}/health" in msg and "s3cret" not in msg
    assert "start_mlflow_server.sh" in msg and "unset MLFLOW_TRACKING_URI" in msg


@pytest.mark.parametrize("variable", ["PREFECT_API_URL", "MLFLOW_TRACKING_URI"])
def test_cli_stops_before_any_work(tmp_path, monkeypatch, capsys, closed_port, variable):
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                "PREFECT_SERVER_ANALYTICS_ENABLED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(variable, f"http://u:pw@127.0.0.1:{closed_port}" + ("/api" if variable.startswith("PREFECT") else ""))
    work = tmp_path / "work"
    assert main(["data", "--workdir", str(work)]) == 3
    err = capsys.readouterr().err
    assert "is not answering" in err and f"127.0.0.1:{closed_port}" in err and ":pw@" not in err
    assert not work.exists()  # nothing was created or run
