"""Prefect's server killed mid-run: the CLI ends with one line and exit 3, not retries without end
(issue 26, item 5; infra/lifecycle/api_watch.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import CLI, ROOT, start_prefect_server
from tests.helpers.data_flow import make_preset

LOST_AFTER_S = 8


@pytest.mark.slow
def test_a_prefect_server_killed_mid_run_ends_the_cli_in_one_line(tmp_path, isolated_env):
    home = tmp_path / "server"
    home.mkdir()
    server, api = start_prefect_server(home)
    log = tmp_path / "cli.log"
    env = {**isolated_env, "PREFECT_API_URL": api, "LLMFORGE_PREFECT_LOST_AFTER_S": str(LOST_AFTER_S)}
    with log.open("w") as out:
        cli = subprocess.Popen(CLI + ["data", "--preset", str(make_preset(tmp_path)), "--workdir", str(tmp_path / "work")],
                               cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "Beginning flow run" not in log.read_text() and cli.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        # Was: still running after 150 s, the events worker failing one event every 7 s.
        cli.wait(timeout=LOST_AFTER_S + 30)
        took = time.monotonic() - killed
    finally:
        if cli.poll() is None:
            cli.kill()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert cli.returncode == 3, text[-3000:]
    assert len(errors) == 1 and "Prefect's API at" in errors[0] and f"{LOST_AFTER_S} s" in errors[0], errors
    assert "Traceback" not in text.split(errors[0])[1]
    assert took < LOST_AFTER_S + 30, took
