"""Pretraining's config, apart from the stage: the pipeline config composes it without importing torch."""
from __future__ import annotations

from pydantic import Field

from infra.hostfile import HostfilePath
from tasks.training.train_config import TrainConfig


class PretrainConfig(TrainConfig):
    """Model preset (+ overrides), every TrainConfig field, and how many ranks to launch."""

    model: str = "demo"  # a models.llama.PRESETS name
    model_overrides: dict[str, int | float | bool] = Field(default_factory=dict)
    num_procs: int = Field(default=1, gt=0)  # ranks per node (GPUs, or CPU processes)
    hostfile: HostfilePath | None = None  # DeepSpeed hostfile for multi-node runs (checked on load)
    # More flags of DeepSpeed's runner for a multi-node run, e.g. ["--master_addr", "10.0.0.1", "--ssh_port", "2222"].
    launcher_args: list[str] = Field(default_factory=list)
    export_hf: bool = True  # also write a transformers.LlamaForCausalLM folder
