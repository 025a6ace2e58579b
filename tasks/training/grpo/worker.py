"""The GRPO rank: `deepspeed --module tasks.training.grpo.worker --job out_dir/job.json` (one rank).

Loads the SFT model as the policy and a frozen copy as the reference, scores both ends
on the held-out eval problems (greedy), runs tasks.training.grpo.loop.grpo_train, logs every
step's metrics and the sample completions to the MLflow run it was given, exports the
policy and writes result.json.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import torch

from infra.deepspeed_launch import RESULT_FILE
from infra.paths import Workspace
from tasks.training.grpo.stage import SAMPLES_FILE, GrpoJob, GrpoStageResult, HeldoutScore


def _score(ev: dict[str, float], distinct_answers: int) -> HeldoutScore:
    n = int(ev["eval_n"])
    return HeldoutScore(accuracy=ev["eval_accuracy"], mean_reward=ev["eval_reward"],
                        n_correct=round(ev["eval_accuracy"] * n), n=n, distinct_answers=distinct_answers)


def distinct_answers(model: torch.nn.Module, tokenizer, problems, max_new_tokens: int) -> int:
    """Number of different integers in the model's greedy answers to `problems` (unparseable ones left out)."""
    from tasks.training.grpo.loop import sample_rollouts
    from tasks.eval.rewards import parse_answer

    rollouts = sample_rollouts(model, tokenizer, problems, 1, max_new_tokens, temperature=0.0)
    return len({parse_answer(r.text) for r in rollouts} - {None})


def _tokenizer_json(path: Path) -> Path | None:
    from tasks.tokenizer.train import TOKENIZER_FILE

    candidate = path / TOKENIZER_FILE if path.is_dir() else path
    return candidate if candidate.is_file() else None


def run_worker(job: GrpoJob) -> GrpoStageResult:
    """Train the policy with GRPO, write the model, samples and result.json; returns the result."""
    from models import export
    from tasks.eval.arithmetic import make_problems
    from tasks.training.grpo.loop import grpo_train
    from tasks.tokenizer.train import load_tokenizer
    from tasks.training.loop import init_distributed

    cfg = job.config
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    init_distributed()
    tokenizer = load_tokenizer(job.tokenizer_path)
    policy = export.load_model(job.sft_model_dir).float()
    reference = copy.deepcopy(policy)
    train_problems = make_problems(cfg.n_train_problems, cfg.problem_seed, cfg.max_operand, cfg.ops, split="grpo")
    eval_problems = make_problems(cfg.eval_prompts, cfg.problem_seed, cfg.max_operand, cfg.ops, split="eval")

    ws = Workspace.locate(job.ws_root)
    from infra.tracking import stage_run

    with stage_run(ws, "grpo", config=cfg if job.mlflow_run_id is None else None, run_id=job.mlflow_run_id) as run:
        import mlflow

        def log(metrics: dict, step: int) -> None:
            clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
            if clean:
                mlflow.log_metrics(clean, step=step)
            if "reward_mean" in metrics and (step % 5 == 0 or step == cfg.steps - 1):
                print(f"step {step + 1}/{cfg.steps} reward {metrics['reward_mean']:.3f} acc {metrics['accuracy']:.3f} "
                      f"kl {metrics['kl']:.4f} len {metrics['completion_len']:.1f} {metrics['step_seconds']:.1f}s")
            elif "eval_accuracy" in metrics:
                print(f"held-out (step {step}): accuracy {metrics['eval_accuracy']:.3f} reward {metrics['eval_reward']:.3f} "
                      f"n={int(metrics['eval_n'])}")

        res = grpo_train(policy, reference, tokenizer, train_problems, cfg.grpo_config(), log=log,
                         eval_problems=eval_problems)
        assert res.eval_before is not None and res.eval_after is not None  # eval_prompts >= 1 is checked at launch
        # The reference is the untouched SFT model, so it stands in for "before".
        distinct_before = distinct_answers(reference, tokenizer, eval_problems, cfg.max_new_tokens)
        distinct_after = distinct_answers(res.policy, tokenizer, eval_problems, cfg.max_new_tokens)
        samples = job.out_dir / SAMPLES_FILE
        samples.write_text(res.samples_text(), encoding="utf-8")
        model_dir = export.save_model(res.policy, job.out_dir / "model")
        hf_dir = None
        if cfg.export_hf:
            hf_dir = export.export_hf_llama(res.policy, job.out_dir / "hf", tokenizer_json=_tokenizer_json(job.tokenizer_path))
        out = GrpoStageResult(
            out_dir=job.out_dir,
            model_dir=model_dir,
            hf_dir=hf_dir,
            samples_path=samples,
            mlflow_run_id=run.info.run_id,
            steps=cfg.steps,
            n_train_problems=len(train_problems),
            before=_score(res.eval_before, distinct_before),
            after=_score(res.eval_after, distinct_after),
            final_train_reward=res.history[-1]["reward_mean"] if res.history else None,
            skipped_steps=res.skipped_steps,
            seconds=res.seconds,
        )
        tmp = job.out_dir / (RESULT_FILE + ".tmp")
        tmp.write_text(out.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(job.out_dir / RESULT_FILE)
        mlflow.log_metrics({
            "heldout_accuracy_before": out.before.accuracy, "heldout_accuracy_after": out.after.accuracy,
            "heldout_reward_before": out.before.mean_reward, "heldout_reward_after": out.after.mean_reward,
            # The counts beside the rates, so the MLflow run reads "27/59 -> 31/59" without arithmetic.
            "heldout_correct_before": float(out.before.n_correct),
            "heldout_correct_after": float(out.after.n_correct),
            "heldout_problems": float(out.after.n),
            "heldout_distinct_answers_before": float(distinct_before),
            "heldout_distinct_answers_after": float(distinct_after),
        }, step=cfg.steps)
        mlflow.log_artifact(str(samples))
        mlflow.log_artifact(str(job.out_dir / RESULT_FILE))
        print(f"GRPO held-out: accuracy {out.before.n_correct}/{out.before.n} -> {out.after.n_correct}/{out.after.n}, "
              f"mean reward {out.before.mean_reward:.3f} -> {out.after.mean_reward:.3f}, "
              f"distinct answers {distinct_before} -> {distinct_after}")
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, required=True, help="job.json written by tasks.training.grpo.stage.run_grpo")
    args = parser.parse_args(argv)
    job = GrpoJob.model_validate_json(args.job.read_text(encoding="utf-8"))
    run_worker(job)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
