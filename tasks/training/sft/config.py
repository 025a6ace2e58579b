"""SFT's configs, apart from the stage: the pipeline config composes them without importing torch."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

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
    # Share of each micro-batch's sequences that are windows of seq_len pretraining tokens (the
    # token shards the flow passes in), trained with next-token loss on every token: without it,
    # fine-tuning on a narrow set (arithmetic) wipes out the base model's language modelling.
    replay_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    num_procs: int = Field(default=1, gt=0)  # ranks per node (GPUs, or CPU processes)
    hostfile: HostfilePath | None = None  # DeepSpeed hostfile for multi-node runs (checked on load)
    # More flags of DeepSpeed's runner for a multi-node run, e.g. ["--master_addr", "10.0.0.1", "--ssh_port", "2222"].
    launcher_args: list[str] = Field(default_factory=list)
    export_hf: bool = True  # also write a transformers.LlamaForCausalLM folder
    # Intra-op threads per rank; tiny models on a shared CPU run far faster on 1 than on many.
    torch_threads: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _replay_rows(self) -> "SftConfig":
        if self.replay_fraction > 0 and not 1 <= self.replay_rows < self.micro_batch_size:
            raise ValueError(
                f"replay_fraction={self.replay_fraction} of micro_batch_size={self.micro_batch_size} gives "
                f"{self.replay_rows} replayed sequence(s) per micro-batch; it must leave at least one of each "
                "kind: change replay_fraction or micro_batch_size (or set replay_fraction: 0)"
            )
        return self

    @property
    def replay_rows(self) -> int:
        """Pretraining windows in each micro-batch; the other rows are SFT examples."""
        return round(self.micro_batch_size * self.replay_fraction)
