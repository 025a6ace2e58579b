"""GRPO stage: launch `tasks.training.grpo.worker` through the DeepSpeed launcher on arithmetic (or GSM8K) problems.

    run_grpo(sft_model_dir, tokenizer_path, out_dir, cfg, mlflow_run_id, ws_root)
      out_dir/grpo_config.json   resolved config
      out_dir/samples.txt        sample completions during training
      out_dir/checkpoints/       DeepSpeed checkpoints every ckpt_every steps; a rerun with the same out_dir resumes
      out_dir/model/             the trained policy (models.export.save_model), out_dir/hf/ for transformers
      out_dir/result.json        held-out accuracy and mean reward before (= the SFT model) and after GRPO

The policy is trained on the `grpo` split of tasks/eval/arithmetic.py and scored greedily on
the `eval` split, which neither SFT nor GRPO ever sees (with `task: gsm8k`, on GSM8K's train
and test splits, tasks/eval/gsm8k.py). GRPO runs single-rank here
(num_procs = 1): rollouts are sampled step by step with a KV cache inside the one
DeepSpeed engine (tasks/training/grpo/loop.py), and on this project's scale there is nothing to
gain from splitting a batch of a few hundred short sequences across ranks.

Measured at the tiny preset's scale (the 2.4M-parameter demo model, 40 steps on 2 CPU
cores, digits tokenised one per token): GRPO at lr 1e-5 lifts held-out sums a few
problems at a time (27/59 -> 31/59 in the README run), and seeds differ by a few
problems either way. At lr 5e-5 the policy drifts from the reference faster than the
KL term holds it and held-out accuracy falls below SFT's. A policy that gives one
answer to every problem scores the share of problems with that sum, so result.json
also counts the distinct greedy answers (`distinct_answers`): read an accuracy gain
together with it.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from pydantic import BaseModel

from tasks.training.config import GrpoConfig
from tasks.training.engine import ds_config_for
from tasks.training.config import RESUME_NEUTRAL
from tasks.training.launch import (
    ExportedModel,
    StageJob,
    StageSpec,
    in_stage_run,
    job_fields,
    run_stage,
    saved_model_config,
)

CONFIG_FILE = "grpo_config.json"
SAMPLES_FILE = "samples.txt"
WORKER_MODULE = "tasks.training.grpo.worker"
# A resume may change only how often it checkpoints and how it runs; the checkpoints also
# carry the reference model's sha256, which the loop checks.
STAGE = StageSpec(name="grpo", label="GRPO", worker_module=WORKER_MODULE, config_file=CONFIG_FILE,
                  resume_neutral=RESUME_NEUTRAL,
                  resume_identity={"sft_model": "SFT model"})


class GrpoJob(StageJob):
    """What the worker process reads (out_dir/job.json)."""

    sft_model_dir: Path
    config: GrpoConfig


class HeldoutScore(BaseModel):
    """Greedy answers on the held-out eval problems."""

    accuracy: float
    mean_reward: float
    n_correct: int
    n: int
    # How many different integers the greedy answers hold: 1 means one answer for every
    # problem, whose accuracy is then the share of problems with that sum, not arithmetic.
    distinct_answers: int


class GrpoStageResult(ExportedModel):
    """What GRPO ended with: the contents of out_dir/result.json."""

    samples_path: Path
    steps: int
    n_train_problems: int
    before: HeldoutScore  # the SFT model
    after: HeldoutScore  # the GRPO policy
    final_train_reward: float | None  # mean reward of the last step's rollouts
    skipped_steps: int
    seconds: float  # training and scoring, summed over the launches of a resumed run
    resumed_from: int | None = None  # the checkpoint step the last launch resumed from


def grpo_problems(cfg: GrpoConfig) -> tuple[list[Any], list[Any]]:
    """(problems to train on, held-out problems to score on) of cfg.task; an error when a split holds too few."""
    if cfg.task == "gsm8k":
        from tasks.eval.gsm8k import load_problems

        src = cfg.gsm8k
        return (load_problems(src, src.train_split, cfg.n_train_problems, cfg.problem_seed),
                load_problems(src, src.eval_split, cfg.eval_prompts, cfg.problem_seed))
    from tasks.eval.arithmetic import make_problems

    return (make_problems(cfg.n_train_problems, cfg.problem_seed, cfg.max_operand, cfg.ops, split="grpo"),
            make_problems(cfg.eval_prompts, cfg.problem_seed, cfg.max_operand, cfg.ops, split="eval"))


def run_grpo(
    sft_model_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    cfg: GrpoConfig,
    mlflow_run_id: str | None,
    ws_root: Path | str | None,
    log: Callable[[str], Any] = print,
) -> GrpoStageResult:
    """Write the config into out_dir, launch the GRPO worker, and read back result.json."""
    sft_model_dir, out_dir = Path(sft_model_dir), Path(out_dir)
    saved_model_config(sft_model_dir, tokenizer_path, "use the model fine-tuned with this tokenizer")
    # Asking for more problems than a split holds (or a hub dataset out of reach) fails here, before the launch.
    grpo_problems(cfg)
    if cfg.eval_prompts < 1:
        raise ValueError("eval_prompts must be >= 1: the stage reports held-out accuracy before and after GRPO")

    resolved = {"grpo": cfg.model_dump(mode="json"), "sft_model": str(sft_model_dir.resolve())}
    job = GrpoJob(sft_model_dir=sft_model_dir.resolve(), config=cfg,
                  **job_fields(tokenizer_path, out_dir, ws_root, mlflow_run_id, cfg.launch.precision))
    # One micro-batch (the whole sampled batch) per optimizer step.
    ds_config = ds_config_for(cfg.optim, cfg.launch, cfg.prompts_per_step * cfg.group_size, 1)
    return run_stage(STAGE, out_dir, resolved, job, GrpoStageResult, ds_config=ds_config,
                     num_procs=cfg.launch.num_procs, log=log)


@task(name="grpo")
def grpo_task(
    sft_model_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    cfg: GrpoConfig,
    ws_root: str | Path | None = None,
    mlflow_run_id: str | None = None,
) -> GrpoStageResult:
    """Prefect task: GRPO inside an MLflow stage run (a new one, or `mlflow_run_id` when given)."""
    logger = get_run_logger()
    return in_stage_run("grpo", cfg, ws_root, mlflow_run_id, lambda run_id, root: run_grpo(
        sft_model_dir, tokenizer_path, out_dir, cfg, run_id, root, log=logger.info))
