"""Shared inputs of the end-to-end tests: the SMALL pipeline overrides and a session-wide stage seed.

`small_stage_seed` runs the data flow (`llmforge data`, the tiny preset with `data.mix.total=400000`),
the tokenizer (`tokenizer.vocab_size=1024`) and the tokenization once per pytest run, in a folder that
every xdist worker sees; a test copies its stage stores into its fresh workspace (`seed_workspace`) and
its runs then reuse those stages, as a rerun in the same workspace would. Only `data/`, `tokenizer/`
and `tokens/` are copied: their recorded results are relative to the workspace, so they move. Never
`mlflow.db` (its experiment's artifact location is the seed's absolute path), `checkpoints/` or `eval/`
(a reused launched stage looks its MLflow run up in the workspace's own store).

A test module uses the fixture by naming it in its namespace: `small_stage_seed = seeds.small_stage_seed`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers.shared import shared_once

# The tiny preset with every stage's budget cut to a few steps: this checks the wiring, the tracking and
# the resume, not the model quality (the README's `make run` does that).
SMALL = [
    "pretrain.steps=6", "pretrain.log.eval_every=3", "pretrain.checkpoint.every=3",
    "pretrain.log.every=3", "tokenizer.vocab_size=1024",
    "sft.steps=4", "sft.log.every=2",
    "grpo.steps=2", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.eval_prompts=6",
    "grpo.n_train_problems=8", "eval.n_questions=6", "eval.max_tokens=1024", "eval.temperature_tokens=512",
    "data.mix.total=400000",
]
# What the seed's data, tokenizer and token stages are keyed on besides the tiny preset: SMALL's, and
# test_scale_flow's TWO_POINTS'.
SEED_OVERRIDES = ["data.mix.total=400000", "tokenizer.vocab_size=1024"]
STAGE_STORES = ("data", "tokenizer", "tokens")

_TOKENIZE = textwrap.dedent("""
    import sys
    from flows.config import resolve_pipeline_config
    from flows.tokens import tokenized
    from infra.workspace.paths import Workspace

    ws, manifest, overrides = Workspace.locate(sys.argv[1]), sys.argv[2], sys.argv[3:]
    cfg = resolve_pipeline_config(None, "tiny", overrides, None)
    print(tokenized(ws, manifest, cfg.tokenizer, cfg.tokenize))
""")


def _cli_env(home: Path, api: str) -> dict[str, str]:
    """conftest's prefect_env for a folder: its own Prefect home and workspace, the session's Prefect server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(home / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="INFO", DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1",
               LLMFORGE_HOME=str(home / "work"), PREFECT_API_URL=api)
    return env


def _build_seed(out: Path, api: str) -> None:
    work = out / "work"
    env = _cli_env(out, api)
    args = ["data", "--preset", "tiny", "--workdir", str(work)]
    data = run_cli(args + [a for kv in SEED_OVERRIDES if kv.startswith("data.") for a in ("--set", kv)], env)
    (manifest,) = [line.split(": ", 1)[1] for line in data.stdout.splitlines() if line.startswith("manifest: ")]
    # The pipeline's tokenizer and token stages, run in place (outside a flow they are plain calls).
    tok = subprocess.run([sys.executable, "-c", _TOKENIZE, str(work), manifest, *SEED_OVERRIDES], env=env,
                         cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)
    assert tok.returncode == 0, tok.stdout[-3000:] + tok.stderr[-3000:]
    assert (work / "tokenizer" / "latest").is_dir() and (work / "tokens" / "latest").is_dir(), tok.stdout[-3000:]


@pytest.fixture(scope="session")
def small_stage_seed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed's workspace (read-only: copy it with `seed_workspace`), built once per pytest run."""
    api = request.getfixturevalue("prefect_api")
    return shared_once(tmp_path_factory, "small-stage-seed", lambda out: _build_seed(out, api)) / "work"


def seed_workspace(seed: Path, workspace: Path) -> Path:
    """Copy the seed's stage stores (data/, tokenizer/, tokens/) into `workspace`, created if missing."""
    workspace.mkdir(parents=True, exist_ok=True)
    for name in STAGE_STORES:
        shutil.copytree(seed / name, workspace / name, symlinks=True)
    return workspace
