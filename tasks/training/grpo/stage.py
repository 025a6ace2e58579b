"""GRPO: groups of sampled answers, verifiable rewards, clipped updates, on one DeepSpeed rank.

    grpo = run(Grpo(config.grpo), ws, sft=sft_model_dir, tokenizer=tokenizer_json, task=config.arithmetic)
      out_dir/grpo_config.json   resolved config
      out_dir/samples.txt        sample completions during training
      out_dir/checkpoints/       DeepSpeed checkpoints every checkpoint.every steps; a rerun into the same out_dir resumes
      out_dir/model/             the trained policy (models.export.save_model), out_dir/hf/ for transformers
      out_dir/result.json        held-out accuracy and mean reward before (= the SFT model) and after GRPO

The policy is trained on the `grpo` split of tasks/eval/arithmetic.py and scored greedily on
the `eval` split, which neither SFT nor GRPO ever sees (with `task: gsm8k`, on GSM8K's train
and test splits, tasks/eval/gsm8k.py). GRPO runs single-rank here (num_procs = 1): rollouts
are sampled step by step with a KV cache inside the one DeepSpeed engine (GrpoSteps in
tasks/training/grpo/steps.py, the one loop's step), and on this project's scale there is nothing
to gain from splitting a batch of a few hundred short sequences across ranks.

A run whose rollouts' reward and KL did not move beyond noise ends flagged `flat`; how far GRPO
moves held-out accuracy, against the spread between seeds: BENCHMARKS.md "GRPO across seeds".
The lr stays low (GrpoOptim): a larger one moves the policy away from the reference faster
than the KL term holds it, and held-out accuracy falls below SFT's
(docs/experiments/2026-12-06-grpo-recipes-on-the-1.3m-model.md). A policy that gives one answer to
every problem scores the share of problems with that sum, so result.json also counts the distinct
greedy answers (`distinct_answers`): read an accuracy gain together with it.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from infra.stages import Launch
from infra.tracking.runs import set_tag
from models.export import load_model
from tasks.eval.answers import AnswerScore
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.gsm8k import load_problems
from tasks.tokenizer.train import load_tokenizer
from tasks.training.config import GrpoConfig
from tasks.training.grpo.steps import GrpoSteps, grpo_shape, samples_text
from tasks.training.stage import ExportedModel, TrainingStage, export_model, launch_of, publish, saved_model_config
from tasks.training.types import TrainResult

SAMPLES_FILE = "samples.txt"


class HeldoutScore(BaseModel):
    """Greedy answers on the held-out eval problems."""

    accuracy: float
    mean_reward: float
    n_correct: int
    n: int
    # How many different integers the greedy answers hold: 1 means one answer for every
    # problem, whose accuracy is then the share of problems with that sum, not arithmetic.
    distinct_answers: int


class GrpoResult(ExportedModel):
    """What GRPO ended with: the contents of out_dir/result.json."""

    samples_path: Path
    steps: int
    n_train_problems: int
    before: HeldoutScore  # the SFT model
    after: HeldoutScore  # the GRPO policy
    final_train_reward: float | None  # mean reward of the last step's rollouts
    skipped_steps: int
    # Reward and KL of the last quarter of steps within noise of the first quarter's: the policy did not
    # move (see `flat_training`); the report and the MLflow run (tag llmforge.grpo_flat) say so.
    flat: bool = False
    seconds: float  # training and scoring, summed over the launches of a resumed run
    resumed_from: int | None = None  # the checkpoint step the last launch resumed from


def grpo_problems(cfg: GrpoConfig, task: ArithmeticTask) -> tuple[list[Any], list[Any]]:
    """(problems to train on, held-out problems to score on) of cfg.task (`task`'s sums for arithmetic); an error when
    a split holds too few."""
    if cfg.task == "gsm8k":
        src = cfg.gsm8k
        return (load_problems(src, src.train_split, cfg.n_train_problems, cfg.problem_seed),
                load_problems(src, src.eval_split, cfg.eval_prompts, cfg.problem_seed))
    train = task.problems(cfg.n_train_problems, cfg.problem_seed, split="grpo")
    if cfg.abstain_n:  # the abstention range: where abstaining pays
        train += task.abstained(cfg.abstain_n, cfg.problem_seed, split="grpo")
    # The "eval" split of the trained range: the in-range questions the evaluation asks too.
    return train, task.problems(cfg.eval_prompts, cfg.problem_seed, split="eval")


def _moved(values: list[float]) -> bool:
    """Whether the mean of the last quarter of `values` differs from the first quarter's beyond noise
    (the normal 95% interval of the difference of the two means excludes 0)."""
    k = len(values) // 4
    if k < 2:
        return True  # too few steps to call anything flat
    first, last = values[:k], values[-k:]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    var = lambda xs: sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1)  # noqa: E731
    se = ((var(first) + var(last)) / k) ** 0.5
    return abs(mean(last) - mean(first)) > 1.96 * se


def flat_training(history: list[dict[str, float]]) -> bool:
    """True when neither the rollouts' mean reward nor the KL to the reference moved beyond noise from the first
    quarter of steps to the last: a GRPO run that changed nothing a reader could see."""
    series = {key: [h[key] for h in history if key in h] for key in ("reward_mean", "kl")}
    return not any(_moved(values) for values in series.values())


def _heldout(score: AnswerScore) -> HeldoutScore:
    """result.json's view of a held-out score."""
    return HeldoutScore(accuracy=score.accuracy, mean_reward=score.mean_reward, n_correct=score.n_correct, n=score.n,
                        distinct_answers=score.distinct_answers)


def heldout_metrics(out: GrpoResult) -> dict[str, float]:
    """Held-out accuracy, reward, counts and distinct answers before and after, as MLflow metrics."""
    return {
        "heldout_accuracy_before": out.before.accuracy, "heldout_accuracy_after": out.after.accuracy,
        "heldout_reward_before": out.before.mean_reward, "heldout_reward_after": out.after.mean_reward,
        # The counts beside the rates, so the MLflow run reads right answers out of problems without arithmetic.
        "heldout_correct_before": float(out.before.n_correct),
        "heldout_correct_after": float(out.after.n_correct),
        "heldout_problems": float(out.after.n),
        "heldout_distinct_answers_before": float(out.before.distinct_answers),
        "heldout_distinct_answers_after": float(out.after.distinct_answers),
        "flat": float(out.flat),
    }


class Grpo(TrainingStage):
    name, store, Config, Result = "grpo", "checkpoints/grpo", GrpoConfig, GrpoResult
    inputs = ("sft", "tokenizer", "task")  # task: the arithmetic task's sums (the pipeline's `arithmetic:` section)
    # Its checkpoints also carry the reference model's sha256, which GrpoSteps checks on a resume.
    config: GrpoConfig

    # ------------------------------------------------------------------------- stage side

    def prepare(self, inputs: dict[str, Any], out_dir: Path) -> Launch:
        cfg, sft, task = self.config, Path(inputs["sft"]), ArithmeticTask.model_validate(inputs["task"])
        saved_model_config(sft, Path(inputs["tokenizer"]), "use the model fine-tuned with this tokenizer")
        # Asking for more problems than a split holds (or a hub dataset out of reach) fails here, before the launch.
        grpo_problems(cfg, task)
        if cfg.eval_prompts < 1:
            raise ValueError("eval_prompts must be >= 1: the stage reports held-out accuracy before and after GRPO")
        shape = grpo_shape(cfg)
        return launch_of(cfg, shape["micro_batch_size"], shape["grad_accum"],
                         identity={"sft_model": str(sft.resolve()), "arithmetic": task.model_dump(mode="json")})

    # ------------------------------------------------------------------------- rank side

    def model(self) -> torch.nn.Module:
        self.policy = load_model(self.job.inputs["sft"]).float()
        return self.policy

    def shape(self) -> dict[str, int]:
        return grpo_shape(self.config)

    def steps(self, rank: int, world: int) -> GrpoSteps:
        self.tokenizer = load_tokenizer(self.job.inputs["tokenizer"])
        self.reference = copy.deepcopy(self.policy)  # the SFT model, frozen, before any update
        task = ArithmeticTask.model_validate(self.job.values["task"])
        self.train_problems, self.eval_problems = grpo_problems(self.config, task)
        self.grpo = GrpoSteps(self.reference, self.tokenizer, self.train_problems, self.config, self.eval_problems)
        return self.grpo

    def finish(self, trained: TrainResult, run: Any, rank: int, world: int) -> None:
        cfg, job, grpo = self.config, self.job, self.grpo
        assert grpo.eval_before is not None and grpo.eval_after is not None  # eval_prompts >= 1 is checked at launch
        samples = job.out_dir / SAMPLES_FILE
        samples.write_text(samples_text(grpo.samples), encoding="utf-8")
        model_dir, hf_dir = export_model(trained.engine.module, job, cfg.export_hf)
        rewards = [h["reward_mean"] for h in trained.history if "reward_mean" in h]
        out = GrpoResult(
            out_dir=job.out_dir, model_dir=model_dir, hf_dir=hf_dir, samples_path=samples, mlflow_run_id=run.info.run_id,
            steps=cfg.steps, n_train_problems=len(self.train_problems),
            before=_heldout(grpo.eval_before), after=_heldout(grpo.eval_after),
            final_train_reward=rewards[-1] if rewards else None,
            skipped_steps=trained.skipped_steps, flat=flat_training(trained.history), seconds=grpo.seconds(),
            resumed_from=trained.resumed_from,
        )
        if run is not None:
            set_tag("llmforge.grpo_flat", str(out.flat).lower())
        publish(run, job.out_dir, out, heldout_metrics(out), cfg.steps, [out.samples_path], trained.memory)
        print(f"GRPO held-out: accuracy {out.before.n_correct}/{out.before.n} -> {out.after.n_correct}/{out.after.n}, "
              f"mean reward {out.before.mean_reward:.3f} -> {out.after.mean_reward:.3f}, "
              f"distinct answers {out.before.distinct_answers} -> {out.after.distinct_answers}"
              + ("; FLAT: reward and KL did not move beyond noise (raise grpo.optim.lr or grpo.steps)" if out.flat else ""))
