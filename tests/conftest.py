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
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
        LLMFORGE_HOME=str(tmp_path / "work"),
    )
    return env


def words(rng: random.Random, n: int) -> str:
    vocab = [f"w{i}" for i in range(400)]
    return " ".join(rng.choice(vocab) for _ in range(n))


_STOP = ["the", "and", "to", "of", "that", "with", "have", "be", "in", "for"]
_WORDS = (
    "river market garden window letter village station harvest winter summer teacher doctor "
    "engine paper music story bridge forest castle kitchen island mountain ocean valley "
    "careful bright quiet ancient modern simple narrow gentle heavy rapid silver golden "
    "builds carries describes follows gathers measures opens reaches repairs studies "
    "travels visits watches writes answers borrows collects counts covers crosses"
).split()


def prose(rng: random.Random, sentences: int = 12) -> str:
    """Varied English-like prose that passes the standard Gopher/C4/FineWeb rules."""
    out = []
    for _ in range(sentences):
        n = rng.randint(8, 16)
        ws = [rng.choice(_STOP) if rng.random() < 0.3 else rng.choice(_WORDS) for _ in range(n)]
        out.append(" ".join(ws).capitalize() + ".")
    return " ".join(out)


CLI = [sys.executable, "-m", "flows.cli"]
