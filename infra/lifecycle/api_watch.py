"""A run whose Prefect server is gone ends, in one line, instead of retrying forever.

Every state change of a flow or task run is a request to Prefect's API, and Prefect's client
retries each one that cannot connect (5 times, 2 to 32 s apart), at exit too: with the
server killed mid-run, the CLI would never exit after the work finished, and a Ctrl-C would
land in one of those retries. The CLI watches the API's health instead: once it has not answered
for `lost_after_s` ($LLMFORGE_PREFECT_LOST_AFTER_S, default 60 s), the run's child processes
are stopped and the process exits with the services code (3). Finished stages are on disk,
content-addressed, so the same command resumes once a server answers; an MLflow run left
RUNNING is continued by that rerun (infra/tracking/runs.py `stage_run`).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import urllib.error
import urllib.request

from infra.config import ConfigError
from infra.lifecycle.preflight import health_url
from infra.lifecycle.process_tree import descendants, stop_processes
from infra.tracking.redaction import redact

# prefect is imported inside the functions that use it: a rank, `llmforge --help` and the CLI's quick errors do not
# pay for its import.

LOST_AFTER_ENV = "LLMFORGE_PREFECT_LOST_AFTER_S"
LOST_AFTER_S = 60.0
EXIT_SERVICES = 3


def _answers(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (Prefect's own API URL)
            return response.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def prefect_api_url() -> str | None:
    """The API this process's flows talk to: PREFECT_API_URL, else Prefect's temporary server if it runs."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value())
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's own client uses
    return server.api_url if server.server_process is not None else None


def lost_after_s() -> float:
    """$LLMFORGE_PREFECT_LOST_AFTER_S seconds, else the default; a bad value is named."""
    raw = os.environ.get(LOST_AFTER_ENV, "").strip()
    if not raw:
        return LOST_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{LOST_AFTER_ENV}={raw!r} is not a number of seconds > 0; unset it for {LOST_AFTER_S:.0f} s")
    return value


def watch_prefect_api(url: str | None = None, lost_s: float | None = None) -> threading.Thread | None:
    """Start a daemon thread that ends this process (exit 3, one line) once the API is silent for `lost_s`."""
    url = url or prefect_api_url()
    if not url:
        return None
    lost_s = lost_after_s() if lost_s is None else lost_s
    poll_s = max(0.5, min(5.0, lost_s / 6))
    target = health_url(url)

    def watch() -> None:
        last_ok = time.monotonic()
        while True:
            if _answers(target, timeout=poll_s):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok >= lost_s:
                break
            time.sleep(poll_s)
        # On a line of its own: Prefect's log handler may have left one unfinished.
        print(f"\nerror: Prefect's API at {redact('url', url)} has not answered for {lost_s:.0f} s (its server "
              "stopped?); the run is stopped: finished stages are kept and the same command resumes once a "
              f"server answers (infra/scripts/start_prefect_server.sh, or unset PREFECT_API_URL)",
              file=sys.stderr, flush=True)
        stop_processes(descendants(), grace_s=5.0)
        # Not sys.exit: the main thread is inside Prefect's retries, and Prefect's exit hooks retry too.
        os._exit(EXIT_SERVICES)

    thread = threading.Thread(target=watch, name="prefect-api-watch", daemon=True)
    thread.start()
    return thread
