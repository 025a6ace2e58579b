"""The GRPO rank: `deepspeed --module tasks.training.grpo.worker --job out_dir/job.json` (one rank).

Loads the SFT model as the policy and a frozen copy as the reference, scores both ends
on the held-out eval problems (greedy), runs tasks.training.grpo.loop.grpo_train (checkpoints
in out_dir/checkpoints, resumed by a rerun), logs every step's metrics and the sample
completions to the MLflow run it was given, exports the policy and writes result.json.
"""
from __future__ import annotations

import copy
import sys

from infra.tracking import log_metrics
from tasks.eval.answers import AnswerScore
from tasks.training import worker
from tasks.training.grpo.loop import GrpoResult, heldout_score
from tasks.training.grpo.stage import (
    SAMPLES_FILE,
    GrpoJob,
    GrpoStageResult,
    HeldoutScore,
    grpo_problems,
)
from tasks.training.launch import CHECKPOINTS_DIR


def _heldout(score: AnswerScore, distinct_answers: int | None = None) -> HeldoutScore:
    """result.json's view of a held-out score; `distinct_answers` overrides the score's own count."""
    return HeldoutScore(accuracy=score.accuracy, mean_reward=score.mean_reward, n_correct=score.n_correct, n=score.n,
                        distinct_answers=score.distinct_answers if distinct_answers is None else distinct_answers)


def heldout_metrics(out: GrpoStageResult) -> dict[str, float]:
    """Held-out accuracy, reward, counts and distinct answers before and after, as MLflow metrics."""
    return {
        "heldout_accuracy_before": out.before.accuracy, "heldout_accuracy_after": out.after.accuracy,
        "heldout_reward_before": out.before.mean_reward, "heldout_reward_after": out.after.mean_reward,
        # The counts beside the rates, so the MLflow run reads "27/59 -> 31/59" without arithmetic.
        "heldout_correct_before": float(out.before.n_correct),
        "heldout_correct_after": float(out.after.n_correct),
        "heldout_problems": float(out.after.n),
        "heldout_distinct_answers_before": float(out.before.distinct_answers),
        "heldout_distinct_answers_after": float(out.after.distinct_answers),
    }


def stage_result(job: GrpoJob, res: GrpoResult, before: HeldoutScore, n_train_problems: int,
                 run_id: str) -> GrpoStageResult:
    """Write the samples and the exported policy; the result that describes them."""
    cfg = job.config
    samples = job.out_dir / SAMPLES_FILE
    samples.write_text(res.samples_text(), encoding="utf-8")
    model_dir, hf_dir = worker.export_model(res.policy, job, cfg.export_hf)
    assert res.eval_after is not None  # eval_prompts >= 1 is checked at launch
    return GrpoStageResult(
        out_dir=job.out_dir, model_dir=model_dir, hf_dir=hf_dir, samples_path=samples, mlflow_run_id=run_id,
        steps=cfg.steps, n_train_problems=n_train_problems, before=before,
        after=_heldout(res.eval_after),
        final_train_reward=res.history[-1]["reward_mean"] if res.history else None,
        skipped_steps=res.skipped_steps, seconds=res.seconds, resumed_from=res.resumed_from,
    )


def run_worker(job: GrpoJob, rank: int, world: int) -> GrpoStageResult:
    """Train the policy with GRPO, write the model, samples and result.json; returns the result."""
    from models import export
    from tasks.tokenizer.train import load_tokenizer
    from tasks.training.grpo.loop import grpo_train

    cfg = job.config
    tokenizer = load_tokenizer(job.tokenizer_path)
    policy = export.load_model(job.sft_model_dir).float()
    reference = copy.deepcopy(policy)
    train_problems, eval_problems = grpo_problems(cfg)
    with worker.rank0_run(job, "grpo", rank) as run:
        res = grpo_train(policy, reference, tokenizer, train_problems, cfg, log=lambda m, step: log_metrics(m, step=step),
                         eval_problems=eval_problems, ckpt_dir=job.out_dir / CHECKPOINTS_DIR, echo=print,
                         ds_config=worker.read_ds_config(job))
        assert res.eval_before is not None  # eval_prompts >= 1 is checked at launch
        # The reference is the untouched SFT model, so it stands in for "before" in the distinct answers.
        distinct_before = heldout_score(reference, tokenizer, eval_problems, cfg).distinct_answers
        out = stage_result(job, res, _heldout(res.eval_before, distinct_before), len(train_problems), run.info.run_id)
        worker.publish(run, job.out_dir, out, heldout_metrics(out), cfg.steps, [out.samples_path])
        print(f"GRPO held-out: accuracy {out.before.n_correct}/{out.before.n} -> {out.after.n_correct}/{out.after.n}, "
              f"mean reward {out.before.mean_reward:.3f} -> {out.after.mean_reward:.3f}, "
              f"distinct answers {out.before.distinct_answers} -> {out.after.distinct_answers}")
        return out


if __name__ == "__main__":
    sys.exit(worker.main(None, GrpoJob, run_worker, __doc__))
