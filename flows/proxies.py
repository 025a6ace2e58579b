"""What the flows that judge data by proxy models share (`llmforge ablate`, `llmforge mix`): a proxy's pretraining,
the held-out targets when none are named, and a proxy scored on the targets."""
from __future__ import annotations

from pathlib import Path

from flows.data_flow import DataResult
from infra.config import ConfigError
from infra.stages import run
from infra.workspace.paths import Workspace
from tasks.eval.score_targets import ScoreTargets, ScoreTargetsConfig, TargetScores
from tasks.training.config import PretrainConfig


def proxy_config(pretrain: PretrainConfig, seed: int) -> PretrainConfig:
    """A pretraining as a proxy: its seed, no export for transformers, one checkpoint at the end."""
    data = pretrain.model_dump()
    data.update(seed=seed, export_hf=False)
    data["checkpoint"]["every"] = 0
    data["log"]["eval_every"] = 0
    return PretrainConfig.model_validate(data)


def held_out_targets(data: DataResult, what: str = "the ablation names no targets") -> dict[str, Path]:
    """Each source's held-out slice as a target (data.holdout: set aside before any filter, the same documents for
    every variant that collects that source)."""
    if not data.held_out:
        raise ConfigError(f"{what} and the data flow held nothing out: name targets, or give `holdout` (a share of "
                          "every source, e.g. 0.1) more documents")
    return dict(data.held_out)


def scores_of(ws: Workspace, model: Path, tokenizer: Path, targets: dict[str, Path], seq_len: int) -> TargetScores:
    """The model scored on each target, window by window (a cached stage: a model is scored once)."""
    return run(ScoreTargets(ScoreTargetsConfig(seq_len=seq_len)), ws, model=model, tokenizer=tokenizer,
               targets=targets)
