"""Preflight: before any work, check that the Prefect and MLflow servers the environment names answer.

Without `PREFECT_API_URL` Prefect runs an ephemeral local API, and without an http(s)
`MLFLOW_TRACKING_URI` MLflow writes a SQLite store in the workspace; only a configured
server can be down, and finding out after an hour of data processing is too late.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping

from infra.config import ConfigError
from infra.tracking.redaction import redact

DEFAULT_TIMEOUT_S = 3.0


class ServiceUnavailable(RuntimeError):
    """A configured Prefect or MLflow server did not answer its health check."""


def health_url(url: str) -> str:
    """Where a service answers `GET` when healthy: Prefect `<api>/health`, MLflow `<server>/health`."""
    return url.rstrip("/") + "/health"


def check_url(service: str, variable: str, url: str, start_script: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """GET the service's health URL; raise ServiceUnavailable naming the (redacted) URL and the fix."""
    target = health_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:  # noqa: S310 (http(s) checked by callers)
            if response.status < 400:
                return
            problem = f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        problem = f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        problem = str(getattr(exc, "reason", exc))
    shown = redact("url", target)
    raise ServiceUnavailable(
        f"{service} server at {shown} is not answering ({problem}); start it with {start_script}, "
        f"or unset {variable} to use the local default"
    )


def check_services(env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Health-check the Prefect API and MLflow server named by the environment (and refuse a tracking URI of a
    scheme MLflow cannot open); returns the URLs checked."""
    env = os.environ if env is None else env
    checked = []
    prefect = (env.get("PREFECT_API_URL") or "").strip()
    if prefect:
        check_url("Prefect", "PREFECT_API_URL", prefect, "infra/scripts/start_prefect_server.sh", timeout)
        checked.append(redact("url", prefect))
    mlflow_uri = (env.get("MLFLOW_TRACKING_URI") or "").strip()
    check_tracking_store(env, timeout)
    if mlflow_uri.lower().startswith(("http://", "https://")):
        checked.append(redact("url", mlflow_uri))
    return checked


# The store schemes MLflow's tracking client opens (mlflow.tracking._tracking_service.utils), each database's
# with or without a SQLAlchemy driver (`+driver`); '' is a local path.
MLFLOW_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks",
                  "databricks-uc", "uc")


def check_tracking_store(env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Before a command reads MLflow's store: an `MLFLOW_TRACKING_URI` of a scheme MLflow cannot open is a
    ConfigError, an http(s) server that does not answer is ServiceUnavailable (MLflow itself would retry for
    minutes and then print a traceback)."""
    env = os.environ if env is None else env
    uri = (env.get("MLFLOW_TRACKING_URI") or "").strip()
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme.split("+", 1)[0] not in MLFLOW_SCHEMES:  # SQLAlchemy's dialect+driver: postgresql+psycopg2
        raise ConfigError(f"MLFLOW_TRACKING_URI {redact('url', uri)}: MLflow has no store of scheme '{scheme}' "
                          f"(it opens {', '.join(s for s in MLFLOW_SCHEMES if s)}); fix it, or unset it to use the "
                          "workspace's own store")
    if scheme in ("http", "https"):
        check_url("MLflow", "MLFLOW_TRACKING_URI", uri, "infra/scripts/start_mlflow_server.sh", timeout)
