"""SFT's configs, apart from the stage: the pipeline config composes them without importing torch."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from infra.config import StrictModel
from infra.hostfile import HostfilePath
from tasks.training.sft.data import ArithmeticSftOptions, SftBuiltin
from tasks.training.train_config import TrainConfig


class SftDataConfig(StrictModel):
    """Which SFT examples to train on."""

    catalog: Path | None = None  # folder of sft_* YAML definitions (e.g. data_catalog/sft/); None: built-in sets
    builtin: list[SftBuiltin] = Field(default_factory=lambda: ["stdlib_docstrings", "arithmetic"])  # when catalog is None
    sources: list[str] | None = None  # only these source names; None: all
    arithmetic: ArithmeticSftOptions | None = None  # overrides every built-in arithmetic source's options
    max_examples: int | None = Field(default=None, gt=0)  # cap per source (overrides the source's own)
    val_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)  # by hash of the example id


class SftConfig(TrainConfig):
    """Every TrainConfig field with fine-tuning defaults, the data selection and how many ranks to launch."""

    # Fine-tuning moves a trained model a little: a lower peak lr and a short warmup than pretraining.
    lr: float = Field(default=1e-4, gt=0)
    warmup_steps: int = Field(default=5, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    max_steps: int = Field(default=200, gt=0)
    seq_len: int = Field(default=128, gt=0)  # longer examples are rejected (exceeds_seq_len), not truncated
    weight_decay: float = Field(default=0.0, ge=0.0)
    data: SftDataConfig = Field(default_factory=SftDataConfig)
    num_procs: int = Field(default=1, gt=0)  # ranks per node (GPUs, or CPU processes)
    hostfile: HostfilePath | None = None  # DeepSpeed hostfile for multi-node runs (checked on load)
    export_hf: bool = True  # also write a transformers.LlamaForCausalLM folder
    # Intra-op threads per rank; tiny models on a shared CPU run far faster on 1 than on many.
    torch_threads: int | None = Field(default=None, gt=0)
