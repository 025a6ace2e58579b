"""Prefect's temporary server started in a thread while the CLI imports the flow (infra/lifecycle/signals.py)."""
from __future__ import annotations

import signal
import threading

import pytest

from infra.lifecycle import signals


def test_the_start_runs_beside_the_caller_with_sigint_blocked_only_in_its_thread(monkeypatch):
    started = threading.Event()
    release = threading.Event()
    seen: dict[str, object] = {}

    def fake_server() -> int:
        seen["thread"] = threading.current_thread().name
        started.set()
        release.wait(5)
        return 4242

    monkeypatch.setattr(signals, "shielded_prefect_server", fake_server)
    wait = signals.prefect_server_starting()
    assert started.wait(5), "the server's start did not begin in its thread"
    # The caller goes on (its imports) while the server starts, and still takes Ctrl-C.
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    release.set()
    assert wait() == 4242
    assert seen["thread"] == "prefect-server-start"


def test_a_failed_start_is_raised_to_the_caller_when_it_waits(monkeypatch):
    def broken() -> int:
        raise RuntimeError("port in use")

    monkeypatch.setattr(signals, "shielded_prefect_server", broken)
    wait = signals.prefect_server_starting()
    with pytest.raises(RuntimeError, match="port in use"):
        wait()


def test_no_server_is_started_when_the_callers_settings_name_an_api():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:1/api"}):
        assert signals.prefect_server_starting()() is None  # the thread sees the caller's settings
