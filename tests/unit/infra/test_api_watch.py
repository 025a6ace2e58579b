"""The Prefect API watch: a silent API ends the process in one line with exit 3; its bound is validated."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from infra.config import ConfigError
from infra.lifecycle.api_watch import lost_after_s
from tests.conftest import ROOT


def test_a_silent_api_ends_the_process_with_exit_3_and_one_line():
    with socket.socket() as s:  # a port nobody listens on: what a killed server leaves
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"import time; from infra.lifecycle.api_watch import watch_prefect_api; "
            f"watch_prefect_api('http://127.0.0.1:{port}/api', lost_s=1.0); time.sleep(60)")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    assert [line for line in done.stderr.splitlines() if line] == [
        f"error: Prefect's API at http://127.0.0.1:{port}/api has not answered for 1 s (its server stopped?); the run "
        "is stopped: finished stages are kept and the same command resumes once a server answers "
        "(infra/scripts/start_prefect_server.sh, or unset PREFECT_API_URL)"]
    assert time.monotonic() - start < 15


def test_the_bound_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.delenv("LLMFORGE_PREFECT_LOST_AFTER_S", raising=False)
    assert lost_after_s() == 60.0
    monkeypatch.setenv("LLMFORGE_PREFECT_LOST_AFTER_S", "12.5")
    assert lost_after_s() == 12.5
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv("LLMFORGE_PREFECT_LOST_AFTER_S", bad)
        with pytest.raises(ConfigError, match="LLMFORGE_PREFECT_LOST_AFTER_S"):
            lost_after_s()
