"""Post-training flows: SFT then GRPO, each a stage launched through DeepSpeed (the pipeline calls the stages itself)."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from infra.workspace.paths import Workspace
from infra.lifecycle.signals import stop_on_cancel
from infra.stages import run
from infra.workspace.lock import workspace_lock
from tasks.training.config import GrpoConfig, SftConfig
from tasks.training.grpo.stage import Grpo, GrpoResult
from tasks.training.sft.stage import Sft, SftResult


@flow(name="sft", log_prints=True)
def sft_flow(config: SftConfig, base_model: str, tokenizer: str, workdir: str = "work",
             tokens: str | None = None) -> SftResult:
    """SFT of `base_model`; `tokens` (the pretraining token shards) feeds config.replay_fraction."""
    ws = Workspace.locate(workdir).ensure_writable()
    with stop_on_cancel(), workspace_lock(ws):
        return run(Sft(config), ws, base=Path(base_model), tokenizer=Path(tokenizer),
                   tokens=Path(tokens) if tokens else None)


@flow(name="grpo", log_prints=True)
def grpo_flow(config: GrpoConfig, sft_model: str, tokenizer: str, workdir: str = "work") -> GrpoResult:
    ws = Workspace.locate(workdir).ensure_writable()
    with stop_on_cancel(), workspace_lock(ws):
        return run(Grpo(config), ws, sft=Path(sft_model), tokenizer=Path(tokenizer))
