"""Shared fixtures: an isolated environment for subprocesses that run real Prefect and MLflow."""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def isolated_env(tmp_path) -> dict[str, str]:
    """Env for a CLI subprocess: its own Prefect home (ephemeral API on SQLite) and MLflow store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
        LLMFORGE_HOME=str(tmp_path / "work"),
    )
    return env


def words(rng: random.Random, n: int) -> str:
    vocab = [f"w{i}" for i in range(400)]
    return " ".join(rng.choice(vocab) for _ in range(n))


CLI = [sys.executable, "-m", "flows.cli"]
