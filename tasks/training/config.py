"""The training stages' configs, composed from the same components (torchtitan's way).

Every training stage (pretraining, SFT, GRPO) has the same keys for the same thing:

    <stage>.optim       lr, betas, weight_decay, warmup_steps, schedule, min_lr_ratio, grad_clip, kernel
    <stage>.launch      num_procs, hostfile, launcher_args, dp, tp, pp, zero, precision, torch_threads, torch_compile
    <stage>.checkpoint  every, keep
    <stage>.log         every, eval_every, eval_batches, peak_flops
    <stage>.steps, <stage>.seed, <stage>.max_bad_steps, <stage>.export_hf

plus what is its own (pretraining's `model` and `batch`, SFT's `data` and `replay_fraction`,
GRPO's groups and rewards). A stage's defaults for a component are a subclass with other
field defaults, so `sft.optim: {lr: 0.001}` keeps SFT's weight decay of 0, not pretraining's.

Torch-free: `flows/config.py` composes these without importing torch into the data flow.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from infra.config import StrictModel
from infra.launch.hostfile import HostfilePath, hostfile_nodes
from models.presets import PRESETS, SHAPE_KEYS, shape_problem
from tasks.eval.arithmetic import ArithmeticTask, problem_capacity
from tasks.eval.gsm8k import Gsm8kSource
from tasks.eval.rewards import check_reward_names

Zero = Literal["zero0", "zero1", "zero2", "zero3", "zero2_offload"]
Precision = Literal["fp32", "bf16", "auto"]
# AdamW kernel (models.optim.OptimizerKernel): auto is fused where torch has it, else foreach.
Kernel = Literal["auto", "fused", "foreach", "for_loop"]


class OptimConfig(StrictModel):
    """AdamW (models/optim.py) and its learning-rate schedule."""

    lr: float = Field(default=3e-4, gt=0)  # the peak
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(default=0.1, ge=0.0)  # on matrices only
    warmup_steps: int = Field(default=10, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"  # after the warmup
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)  # cosine floor, as a fraction of lr
    grad_clip: float = Field(default=1.0, ge=0.0)  # 0 disables clipping
    kernel: Kernel = "auto"


class LaunchConfig(StrictModel):
    """How the stage's ranks are started (DeepSpeed's launcher) and what they compute in."""

    num_procs: int = Field(default=1, gt=0)  # ranks per node (GPUs, or CPU processes)
    hostfile: HostfilePath | None = None  # DeepSpeed hostfile for multi-node runs (checked on load)
    # More flags of DeepSpeed's runner for a multi-node run, e.g. ["--master_addr", "10.0.0.1", "--ssh_port", "2222"].
    launcher_args: list[str] = Field(default_factory=list)
    # The layout of the ranks: dp x tp x pp = world size (num_procs x the hostfile's nodes). tp splits every
    # matrix over tp ranks (models/tensor_parallel.py), pp gives each of pp ranks a run of layers (DeepSpeed's
    # pipeline engine, models/pipeline.py), dp copies the rest; dp None: whatever tp and pp leave.
    dp: int | None = Field(default=None, gt=0)
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    zero: Zero = "zero0"
    precision: Precision = "auto"
    # Intra-op threads per rank; tiny models on a shared CPU run far faster on 1 than on many.
    torch_threads: int | None = Field(default=None, gt=0)
    # torch.compile the model inside the engine (in place: checkpoints and exports keep their keys). Pays off on
    # a GPU for long runs; the first steps then include the compilation, and the CPU build needs a C++ compiler.
    torch_compile: bool = False
    # A rank that uses no CPU for this long (stopped, hung) ends the launch with a message naming it
    # (infra/launch/rank_watch.py); None: never. Raise it for ranks that legitimately wait long.
    rank_timeout_s: float | None = Field(default=1800.0, gt=0)

    @property
    def world_size(self) -> int:
        """Ranks in all: num_procs on each node of the hostfile (one node without one)."""
        return self.num_procs * (len(hostfile_nodes(self.hostfile)) if self.hostfile is not None else 1)

    @property
    def data_parallel(self) -> int:
        return self.dp if self.dp is not None else self.world_size // (self.tp * self.pp)

    @model_validator(mode="after")
    def _layout(self) -> "LaunchConfig":
        world, split = self.world_size, self.tp * self.pp
        layout = f"launch dp={self.dp or 'auto'} x tp={self.tp} x pp={self.pp} with zero={self.zero}"
        if world % split or self.data_parallel * split != world:
            raise ValueError(f"{layout}: dp x tp x pp must equal the world size {world} (num_procs={self.num_procs} "
                             "x the hostfile's nodes); change dp, tp, pp or num_procs")
        if self.pp > 1 and self.zero in ("zero2", "zero3", "zero2_offload"):
            raise ValueError(f"{layout}: DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1 only (ZeRO-2/3 split the "
                             "gradients it accumulates over micro-batches); set zero: zero1 or pp: 1")
        if self.tp > 1 and self.zero != "zero0":
            raise ValueError(f"{layout}: tensor-parallel weights are DTensors, which ZeRO's flattened partitions "
                             "cannot hold; set zero: zero0 (dp replicas then all-reduce their shards) or tp: 1")
        if self.tp > 1 and self.pp > 1:
            raise ValueError(f"{layout}: tensor and pipeline parallelism together are not built yet; "
                             "use one of them (tp: 1 or pp: 1)")
        if self.torch_compile and (self.tp > 1 or self.pp > 1):
            raise ValueError(f"{layout}: torch_compile runs on plain data parallel only; set torch_compile: false")
        return self


class CheckpointConfig(StrictModel):
    every: int = Field(default=0, ge=0)  # steps; 0: only at the end
    keep: int = Field(default=2, gt=0)  # older checkpoint folders are deleted


class LogConfig(StrictModel):
    every: int = Field(default=10, gt=0)  # steps per logged window of loss, lr, throughput
    eval_every: int = Field(default=0, ge=0)  # 0: only at the end
    eval_batches: int = Field(default=4, ge=0)
    peak_flops: float | None = Field(default=None, gt=0)  # per-rank FLOP/s for MFU; None: measure once


class BatchConfig(StrictModel):
    seq_len: int = Field(default=256, gt=0)
    micro_batch_size: int = Field(default=8, gt=0)  # sequences per rank per micro-batch
    grad_accum: int = Field(default=1, gt=0)  # micro-batches per optimizer step

    def tokens_per_step(self, world: int) -> int:
        return self.micro_batch_size * self.seq_len * self.grad_accum * world


class TrainingConfig(StrictModel):
    """What every training stage has, and what the one loop (tasks/training/loop.py) reads: its steps and seed, the
    non-finite policy, the export, and the shared components. A stage adds its own keys and, where its defaults
    differ, a subclass of a component (SftOptim, GrpoLaunch, ...)."""

    steps: int = Field(default=100, gt=0)
    seed: int = 0
    max_bad_steps: int = Field(default=5, gt=0)  # consecutive non-finite steps before failing
    export_hf: bool = True  # also write a transformers.LlamaForCausalLM folder
    optim: OptimConfig = Field(default_factory=OptimConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    log: LogConfig = Field(default_factory=LogConfig)


# Settings that may differ between a run and its resume without changing what is trained.
RESUME_NEUTRAL = frozenset({"log", "checkpoint", "max_bad_steps", "export_hf", "launch.hostfile",
                            "launch.launcher_args", "launch.torch_threads", "launch.torch_compile",
                            "launch.rank_timeout_s"})


class PretrainConfig(TrainingConfig):
    model: str = "demo"  # a models/presets.py name
    model_overrides: dict[str, int | float | bool] = Field(default_factory=dict)
    batch: BatchConfig = Field(default_factory=BatchConfig)

    @field_validator("model")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)} (models/presets.py)")
        return name

    def shape(self) -> dict[str, Any]:
        """The model's shape (models/presets.py with model_overrides), without torch: what the layout checks read."""
        return {**PRESETS[self.model], **self.model_overrides}

    @field_validator("model_overrides")
    @classmethod
    def _known_shape_keys(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(SHAPE_KEYS))
        if unknown:
            hint = "; the vocabulary is tokenizer.vocab_size" if "vocab_size" in unknown else ""
            raise ValueError(f"pretrain.model_overrides {unknown}: no such key of a model's shape; "
                             f"the keys are {list(SHAPE_KEYS)}{hint}")
        return overrides

    @model_validator(mode="after")
    def _layout_fits_the_model(self) -> "PretrainConfig":
        shape = self.shape()
        problem = shape_problem(shape)
        if problem:
            raise ValueError(f"pretrain.model={self.model} with model_overrides {self.model_overrides}: {problem}")
        problem = layout_problem(self.launch, shape, "pretrain") or seq_len_problem(self.batch.seq_len, shape, "pretrain")
        if problem:
            raise ValueError(problem)
        return self


def seq_len_problem(seq_len: int, shape: dict[str, Any], stage: str) -> str | None:
    """A stage's windows longer than the model's positions (None: they fit)."""
    if seq_len > shape["max_seq_len"]:
        return (f"{stage}.batch.seq_len={seq_len} exceeds the model's max_seq_len={shape['max_seq_len']}; lower it, "
                "or raise pretrain.model_overrides.max_seq_len")
    return None


def layout_problem(launch: "LaunchConfig", shape: dict[str, Any], stage: str) -> str | None:
    """What a launch's tp and pp cannot do on a model of `shape` (None: nothing), checked when the config is read:
    pp above the layers, tp that does not divide the heads or MLP units, tp with bf16 asked for by name."""
    if launch.pp > shape["n_layers"]:
        return (f"{stage}.launch.pp={launch.pp} exceeds the model's n_layers={shape['n_layers']}: each pipeline stage "
                "needs a block; lower pp")
    for name in ("n_heads", "n_kv_heads", "ffn_hidden") if launch.tp > 1 else ():
        if shape[name] % launch.tp:
            return (f"{stage}.launch.tp={launch.tp} does not divide the model's {name}={shape[name]}: each tensor-"
                    "parallel rank holds whole heads and MLP units; choose a tp that divides it")
    if launch.tp > 1 and launch.precision == "bf16":
        return (f"{stage}.launch.tp={launch.tp} with precision bf16: DeepSpeed's bf16 optimizer flattens the weights, "
                f"which tensor-parallel DTensors refuse; set {stage}.launch.precision: fp32")
    return None


SftBuiltin = Literal["stdlib_docstrings", "arithmetic"]  # the built-in SFT sets (tasks/training/sft/data.py)


class ArithmeticSftOptions(StrictModel):
    """The built-in arithmetic SFT set: how many sums of the task's trained range, and how many of its abstention
    range answered "I don't know" (the ranges and ops are the pipeline's `arithmetic:` section)."""

    n: int = Field(default=400, gt=0)
    seed: int = 0
    # Abstention: `abstain_n` more sums from the abstention range, answered "I don't know" (tasks/eval/rewards.ABSTENTION),
    # so the model learns the one way to abstain.
    abstain_n: int = Field(default=0, ge=0)
    # This many more such sums, for validation only (never trained on, whatever val_fraction says): the validation set
    # checks the abstention too without taking examples from training. Drawn after the abstain_n ones.
    val_abstain_n: int = Field(default=0, ge=0)
    # The abstained sums have an operand above this (default arithmetic.max_operand). Above it, it leaves a band of
    # sums SFT neither answers nor abstains on: where the model's knowledge ends is GRPO's to find.
    abstain_above: int | None = Field(default=None, ge=0)
    # This many of the n sums inside the range answered "I don't know" instead (drawn by seed): a prior inside the
    # range for GRPO to move (docs/experiments/2026-12-07-abstention-prior-inside-the-range.md).
    abstain_in_range: int = Field(default=0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _range_is_the_tasks(cls, data: Any) -> Any:
        moved = {"max_operand": "max_operand", "ops": "ops", "abstain_max_operand": "abstain_max_operand"}
        for key in moved if isinstance(data, dict) else ():
            if key in data:
                raise ValueError(f"key '{key}' of the arithmetic SFT options is now the pipeline's "
                                 f"'arithmetic.{moved[key]}' (one section that SFT, GRPO and the evaluation read)")
        return data

    @model_validator(mode="after")
    def _abstain_in_range_at_most_n(self) -> "ArithmeticSftOptions":
        if self.abstain_in_range > self.n:
            raise ValueError(f"abstain_in_range={self.abstain_in_range} must be at most n={self.n}: it picks which of "
                             "the n questions inside the range are answered \"I don't know\"")
        return self

    def abstained_above(self, task: ArithmeticTask) -> int:
        """The abstained sums have an operand above this: abstain_above, else the task's trained range."""
        return task.max_operand if self.abstain_above is None else self.abstain_above

    def check(self, task: ArithmeticTask, where: str = "sft.data.arithmetic") -> None:
        """A ValueError naming `where` when the task's ranges cannot give these sums: counted here, on the stage side
        or when the config is read, not in a rank after its launch."""
        if self.n > (inside := problem_capacity(task.max_operand, task.ops, "sft")):
            raise ValueError(f"{where}.n={self.n}, but only {inside} sums of the sft split have operands up to "
                             f"arithmetic.max_operand={task.max_operand} with ops={task.ops!r}: lower n or raise "
                             "arithmetic.max_operand")
        unsure = self.abstain_n + self.val_abstain_n
        if not unsure:
            return
        name = f"{where}.abstain_n" if self.abstain_n else f"{where}.val_abstain_n"
        top = task.abstention_range(name)
        above = self.abstained_above(task)
        if not task.max_operand <= above < top:
            raise ValueError(f"{where}.abstain_above={above} must lie in [arithmetic.max_operand={task.max_operand}, "
                             f"arithmetic.abstain_max_operand={top}): the abstained sums have an operand above it")
        if unsure > (room := problem_capacity(top, task.ops, "sft", above)):
            raise ValueError(f"{where}.abstain_n + val_abstain_n = {self.abstain_n} + {self.val_abstain_n} = {unsure}, "
                             f"but only {room} sums of the sft split have an operand in ({above}, {top}]: lower them "
                             "or raise arithmetic.abstain_max_operand")


class SftDataConfig(StrictModel):
    """Which SFT examples to train on."""

    catalog: Path | None = None  # folder of sft_* YAML definitions (e.g. data_catalog/sft/); None: built-in sets
    builtin: list[SftBuiltin] = Field(default_factory=lambda: ["stdlib_docstrings", "arithmetic"])  # when catalog is None
    sources: list[str] | None = None  # only these source names; None: all
    arithmetic: ArithmeticSftOptions | None = None  # overrides every built-in arithmetic source's options
    max_examples: int | None = Field(default=None, gt=0)  # cap per source (overrides the source's own)
    val_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)  # by hash of the example id


class SftBatch(BatchConfig):
    seq_len: int = Field(default=128, gt=0)  # longer examples are rejected (exceeds_seq_len), not truncated


class SftOptim(OptimConfig):
    # Fine-tuning moves a trained model a little: a lower peak lr and a short warmup than pretraining.
    lr: float = Field(default=1e-4, gt=0)
    warmup_steps: int = Field(default=5, ge=0)
    weight_decay: float = Field(default=0.0, ge=0.0)


class SftConfig(TrainingConfig):
    steps: int = Field(default=200, gt=0)
    data: SftDataConfig = Field(default_factory=SftDataConfig)
    # Share of each micro-batch's sequences that are windows of seq_len pretraining tokens (the
    # token shards the flow passes in), trained with next-token loss on every token: without it,
    # fine-tuning on a narrow set (arithmetic) wipes out the base model's language modelling.
    replay_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    batch: SftBatch = Field(default_factory=SftBatch)
    optim: SftOptim = Field(default_factory=SftOptim)

    @model_validator(mode="after")
    def _no_pipeline(self) -> "SftConfig":
        if self.launch.pp > 1:
            raise ValueError(f"sft.launch.pp={self.launch.pp}: pipeline parallelism trains pretraining only (the "
                             "pipeline computes next-token loss on every token; SFT masks prompts); set pp: 1")
        return self

    @model_validator(mode="after")
    def _replay_rows(self) -> "SftConfig":
        if self.replay_fraction > 0 and not 1 <= self.replay_rows < self.batch.micro_batch_size:
            raise ValueError(
                f"replay_fraction={self.replay_fraction} of batch.micro_batch_size={self.batch.micro_batch_size} "
                f"gives {self.replay_rows} replayed sequence(s) per micro-batch; it must leave at least one of each "
                "kind: change replay_fraction or batch.micro_batch_size (or set replay_fraction: 0)"
            )
        return self

    @property
    def replay_rows(self) -> int:
        """Pretraining windows in each micro-batch; the other rows are SFT examples."""
        return round(self.batch.micro_batch_size * self.replay_fraction)


class GrpoOptim(OptimConfig):
    # A constant lr, as usual for GRPO: the policy starts from a tuned model.
    lr: float = Field(default=1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["cosine", "constant"] = "constant"


class GrpoLaunch(LaunchConfig):
    # ZeRO-3 is not offered: it partitions the weights, and the step-by-step KV-cache sampler
    # would then gather every layer on every token. One rank: a batch of a few hundred short
    # sequences has nothing to gain from being split.
    num_procs: int = Field(default=1, ge=1, le=1)
    zero: Literal["zero0", "zero1", "zero2"] = "zero0"
    precision: Precision = "fp32"


class GrpoCheckpoint(CheckpointConfig):
    every: int = Field(default=10, ge=0)


class GrpoLog(LogConfig):
    every: int = Field(default=1, gt=0)  # every step's rollout metrics


class GrpoConfig(TrainingConfig):
    """One GRPO run: the groups it samples, its rewards, the problems it trains and scores on."""

    steps: int = Field(default=50, gt=0)
    group_size: int = Field(default=8, ge=2)  # completions per prompt (G)
    prompts_per_step: int = Field(default=8, gt=0)
    # DAPO's dynamic sampling (rollouts.informative_groups): draw prompts_per_step x oversample prompts a step and
    # train on the first prompts_per_step whose completions scored differently; 1 trains on every prompt drawn. With
    # abstain_guidance every group holds a guided abstention beside its samples, so few groups are filtered.
    oversample: int = Field(default=1, ge=1)
    max_new_tokens: int = Field(default=24, gt=0)  # "<answer>nn</answer>" is ~16 tokens, plus <|end|>
    temperature: float = Field(default=1.0, gt=0)  # > 0: a greedy group would hold G copies of one answer
    top_p: float = Field(default=1.0, gt=0, le=1)
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    beta: float = Field(default=0.04, ge=0)  # weight of the KL penalty towards the reference
    updates_per_batch: int = Field(default=2, gt=0)  # optimizer steps on each sampled batch
    rewards: dict[str, float] = Field(default_factory=lambda: {"arithmetic_exact": 1.0, "format": 0.1})
    accuracy_reward: str = "arithmetic_exact"  # a completion is correct when this reward is >= 1
    eval_prompts: int = Field(default=64, ge=0)  # held-out prompts scored greedily before and after
    samples_every: int = Field(default=10, gt=0)  # keep sample completions every this many steps
    samples_per_step: int = Field(default=2, ge=0)
    # arithmetic: the "grpo" split of the pipeline's arithmetic task (its trained range) to train on, its "eval" split
    # to score on; gsm8k: word problems from `gsm8k` (train_split to train on, eval_split to score on; tasks/eval/gsm8k.py).
    task: Literal["arithmetic", "gsm8k"] = "arithmetic"
    gsm8k: Gsm8kSource = Field(default_factory=Gsm8kSource)
    n_train_problems: int = Field(default=160, gt=0)  # drawn from the task's training split (the default task holds 171)
    # Abstention: `abstain_n` more training problems from the arithmetic task's abstention range, where the policy is
    # rarely right and the `abstain` reward teaches it to say "I don't know" instead of guessing.
    abstain_n: int = Field(default=0, ge=0)
    # Completions per group replaced by the abstention (rollouts.guide_abstentions): inside the trained range the SFT
    # policy gives "I don't know" too little probability to sample it, so without this it never samples, and never
    # learns, abstaining where it is likely wrong (docs/experiments/2026-12-06-sft-batch-and-grpo-bases.md). Needs the
    # `abstain` reward. A step's logged reward_mean and accuracy count the guided completions too.
    abstain_guidance: int = Field(default=0, ge=0)
    # Guide only the groups where at most this share of the samples the guidance leaves are right
    # (rollouts.unsure_groups); 1 guides every group. Under the abstain reward's share of a right answer's (0.3 in
    # the preset), the guided abstention scores above the group's mean: it is raised where the policy is likely
    # wrong and never pushed down where it is likely right.
    abstain_guidance_max_accuracy: float = Field(default=1.0, ge=0, le=1)
    # Weight of a supervised term on the guided abstentions (rollouts.abstention_nll): their mean NLL, added to the
    # loss unclipped, so "I don't know" is taught where the policy's samples are mostly wrong even while it is far too
    # improbable for the clipped policy term to move; 0 leaves them to the policy term.
    abstain_sft: float = Field(default=0.0, ge=0)
    problem_seed: int = 0
    optim: GrpoOptim = Field(default_factory=GrpoOptim)
    launch: GrpoLaunch = Field(default_factory=GrpoLaunch)
    checkpoint: GrpoCheckpoint = Field(default_factory=GrpoCheckpoint)
    log: GrpoLog = Field(default_factory=GrpoLog)

    # The GRPO worker looks its rewards up by name hours into a run; an unknown name fails here instead, and before
    # the rules between fields, so a misspelt reward is named as such, not as the abstain rule it then breaks.
    @field_validator("rewards")
    @classmethod
    def _rewards_known(cls, rewards: dict[str, float]) -> dict[str, float]:
        if not rewards:
            raise PydanticCustomError("unknown_reward", "{detail}",
                                      {"detail": "grpo.rewards is empty; give at least one {name: weight}"})
        check_reward_names("grpo.rewards", list(rewards))
        return rewards

    @field_validator("accuracy_reward")
    @classmethod
    def _accuracy_reward_known(cls, name: str) -> str:
        check_reward_names("grpo.accuracy_reward", [name])
        return name

    def check_task(self, task: ArithmeticTask) -> None:
        """A ValueError when the arithmetic task's splits hold fewer sums than GRPO draws: its training sums (the grpo
        split), its abstained ones (the grpo split beyond the trained range) and its evaluation prompts (eval)."""
        if self.task != "arithmetic":
            return
        asks = [("n_train_problems", self.n_train_problems, "grpo", task.max_operand, None),
                ("eval_prompts", self.eval_prompts, "eval", task.max_operand, None)]
        if self.abstain_n:
            asks.append(("abstain_n", self.abstain_n, "grpo", task.abstention_range(f"grpo.abstain_n={self.abstain_n}"),
                         task.max_operand))
        for key, n, split, top, above in asks:
            if n > (room := problem_capacity(top, task.ops, split, above)):
                where = f"an operand in ({above}, {top}]" if above is not None else f"operands up to {top}"
                raise ValueError(f"grpo.{key}={n}, but only {room} sums of the {split} split have {where} with "
                                 f"ops={task.ops!r}: lower grpo.{key}, or widen the arithmetic task's range")

    @model_validator(mode="after")
    def _abstain_between(self) -> "GrpoConfig":
        if self.abstain_guidance and "abstain" not in self.rewards:
            raise ValueError(f"grpo.abstain_guidance={self.abstain_guidance} needs the abstain reward in grpo.rewards "
                             "to score the guided abstentions, e.g. abstain: 0.3")
        if self.abstain_sft and not self.abstain_guidance:
            raise ValueError(f"grpo.abstain_sft={self.abstain_sft} weighs the guided abstentions: it needs "
                             "grpo.abstain_guidance above 0")
        if self.abstain_guidance >= self.group_size:
            raise ValueError(f"grpo.abstain_guidance={self.abstain_guidance} must be below grpo.group_size="
                             f"{self.group_size}: a group needs samples of its own beside the guided abstentions")
        if self.accuracy_reward not in self.rewards:  # a map given whole replaces the preset's: say what vanished
            raise ValueError(f"grpo.rewards {self.rewards} has no reward for a right answer ({self.accuracy_reward}, "
                             "grpo.accuracy_reward): a map given whole replaces the preset's; change one reward with "
                             f"--set grpo.rewards.abstain=0.3, or give the whole map, e.g. {{{self.accuracy_reward}: 1.0, "
                             "format: 0.1, abstain: 0.3}")
        # right > abstain > wrong: an abstention paying as much as a right answer would teach the policy
        # to abstain on everything, one paying nothing would not teach it to abstain at all.
        right, unknown = self.rewards.get(self.accuracy_reward), self.rewards.get("abstain")
        if right is not None and unknown is not None and not 0.0 < unknown < right:
            raise ValueError(f"grpo.rewards.abstain={unknown} must lie between 0 and grpo.rewards.{self.accuracy_reward}="
                             f"{right} so that right > abstain > wrong; e.g. abstain: {right * 0.3:g}")
        return self


# Keys of the configs before they were composed, and where each went: a preset or `--set` that still uses one gets
# an error naming the new key instead of "extra inputs".
LOOP_KEYS = {
    "seq_len": "batch.seq_len", "micro_batch_size": "batch.micro_batch_size", "grad_accum": "batch.grad_accum",
    "lr": "optim.lr", "betas": "optim.betas", "weight_decay": "optim.weight_decay",
    "warmup_steps": "optim.warmup_steps", "min_lr_ratio": "optim.min_lr_ratio", "grad_clip": "optim.grad_clip",
    "optimizer_kernel": "optim.kernel", "max_steps": "steps", "zero": "launch.zero", "precision": "launch.precision",
    "num_procs": "launch.num_procs", "hostfile": "launch.hostfile", "launcher_args": "launch.launcher_args",
    "torch_threads": "launch.torch_threads", "torch_compile": "launch.torch_compile",
    "ckpt_every": "checkpoint.every", "keep_checkpoints": "checkpoint.keep", "log_every": "log.every",
    "eval_every": "log.eval_every", "eval_batches": "log.eval_batches", "peak_flops": "log.peak_flops",
}


RENAMED: dict[str, str] = {
    "pretrain.tokenizer": "tokenizer",
    "pretrain.tokenize": "tokenize",
    **{f"pretrain.train.{old}": f"pretrain.{new}" for old, new in LOOP_KEYS.items()},
    **{f"pretrain.train.{key}": f"pretrain.{key}" for key in ("model", "model_overrides", "seed", "max_bad_steps",
                                                              "export_hf")},
    **{f"sft.{old}": f"sft.{new}" for old, new in LOOP_KEYS.items()},
    **{f"grpo.{old}": f"grpo.{new}" for old, new in LOOP_KEYS.items() if old != "max_steps"},
}
