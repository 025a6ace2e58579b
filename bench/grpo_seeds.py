"""GRPO over several seeds on one SFT model: is its held-out gain larger than the spread between seeds?

    DS_ACCELERATOR=cpu .venv/bin/python bench/grpo_seeds.py \
        --sft-model work/checkpoints/sft/latest/model --tokenizer work/tokenizer/latest --seeds 0 1 2

runs the GRPO stage (tasks/training/grpo/stage.py, the preset's `grpo` section) once per seed,
each into its own folder of a scratch workspace (`--workdir`, default a temporary folder: its
own MLflow runs, never the pipeline's), then asks the SFT model and every policy the preset's
evaluation questions (`eval` section: held out, never trained on) and prints, per seed, the
accuracy with its Wilson 95% interval and the paired GRPO - SFT difference, then the mean ± sd
over seeds. One seed's gain means little when seeds spread as far as the gain. Per seed it also gives
the hallucination rate (wrong and not abstained, of all questions) beside SFT's, and GRPO's two goals as
PASS/FAIL: the in-range gain significant above 0 on >= 200 questions; the hallucination rate at most half
SFT's without in-range accuracy falling (paired interval).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from flows.config import load_pipeline_config, parse_overrides  # noqa: E402
from tasks.eval.intervals import paired_difference, proportion  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft-model", type=Path, required=True, help="the SFT model folder (a stage's model/)")
    p.add_argument("--tokenizer", type=Path, required=True, help="its tokenizer (folder or tokenizer.json)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GRPO seeds (default 0 1 2; at least 3 for an sd)")
    p.add_argument("--preset", default="tiny", help="the preset whose grpo and eval sections are used (default tiny)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per seed (default: the preset's grpo.steps)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset key, e.g. --set grpo.optim.lr=2e-5 (repeatable)")
    p.add_argument("--workdir", type=Path, default=None, help="scratch workspace (default: a new temporary folder)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def answers_of(model_dir: Path, tokenizer, problems, eval_cfg) -> dict[str, tuple[bool, bool]]:
    """(right, abstained) of the model's greedy chat answer to each question, by question."""
    from models.export import load_model
    from tasks.eval.evaluate import answer_records

    model = load_model(model_dir)
    return {a.question: (a.correct, a.abstained) for a in answer_records(model, tokenizer, problems, eval_cfg)}


def hallucinated(answers: dict[str, tuple[bool, bool]], questions: list[str]):
    """The share of `questions` answered wrong and not abstained on, with its Wilson interval: the evaluation's own
    hallucination rate (tasks/eval/abstention.py)."""
    from tasks.eval.abstention import abstention_report

    return abstention_report([answers[q][0] for q in questions], [answers[q][1] for q in questions]).hallucination


def main(argv: list[str] | None = None) -> int:
    import torch

    from infra.stages import in_run
    from infra.workspace.paths import Workspace
    from tasks.tokenizer.train import load_tokenizer
    from tasks.training.grpo.stage import Grpo

    args = parse_args(argv)
    if len(args.seeds) != len(set(args.seeds)):
        raise SystemExit(f"--seeds {args.seeds} repeats a seed; give distinct seeds")
    config = load_pipeline_config(args.preset, parse_overrides(args.overrides))
    grpo_cfg = config.grpo.model_copy(update={"export_hf": False, **({"steps": args.steps} if args.steps else {})})
    e, task = config.eval, config.arithmetic
    problems = task.questions(e.n_questions, e.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="grpo-seeds-"))
    torch.set_num_threads(grpo_cfg.launch.torch_threads or 1)  # the scoring here; tiny models run fastest on one thread
    tokenizer = load_tokenizer(args.tokenizer)
    print(f"{len(problems)} held-out questions (preset {args.preset!r}, operands <= {task.outer_max_operand}); "
          f"GRPO {grpo_cfg.steps} steps per seed, lr {grpo_cfg.optim.lr}; workspace {workdir}", flush=True)

    sft_answers = answers_of(args.sft_model, tokenizer, problems, e)
    sft = {q: right for q, (right, _) in sft_answers.items()}
    questions = list(sft)
    sft_halluc = hallucinated(sft_answers, questions)
    # GRPO trains on the task's trained range: its effect, if any, shows there first.
    in_range = [q for q in questions if task.has_outer_range and task.in_range(q)]
    before = proportion([sft[q] for q in questions])
    before_in = proportion([sft[q] for q in in_range]) if in_range else None
    print(f"SFT: {before.describe()}" + (f"; in the training range: {before_in.describe()}" if before_in else "")
          + f"; hallucinated {sft_halluc.describe()}", flush=True)
    rows = []
    for seed in args.seeds:
        started = time.time()
        result = in_run(Grpo(grpo_cfg.model_copy(update={"seed": seed})), Workspace.locate(workdir), workdir / f"seed{seed}",
                        log=lambda line: None, sft=Path(args.sft_model), tokenizer=Path(args.tokenizer), task=task)
        after_answers = answers_of(result.model_dir, tokenizer, problems, e)
        after = {q: right for q, (right, _) in after_answers.items()}
        halluc = hallucinated(after_answers, questions)
        score = proportion([after[q] for q in questions])
        diff = paired_difference([sft[q] for q in questions], [after[q] for q in questions])
        score_in = proportion([after[q] for q in in_range]) if in_range else None
        diff_in = paired_difference([sft[q] for q in in_range], [after[q] for q in in_range]) if in_range else None
        rows.append({"seed": seed, "accuracy": score.accuracy, "correct": score.correct, "n": score.n,
                     **({"in_range_correct": score_in.correct, "in_range_n": score_in.n, "in_range_accuracy": score_in.accuracy,
                         "in_range_diff": diff_in.difference, "in_range_diff_lo": diff_in.lo, "in_range_diff_hi": diff_in.hi}
                        if in_range else {}),
                     "accuracy_lo": score.accuracy_lo, "accuracy_hi": score.accuracy_hi,
                     "diff": diff.difference, "diff_lo": diff.lo, "diff_hi": diff.hi,
                     "hallucination": halluc.accuracy, "hallucination_lo": halluc.accuracy_lo,
                     "hallucination_hi": halluc.accuracy_hi, "abstained": sum(a for _, a in after_answers.values()),
                     # GRPO's two goals on this seed: (1) in range, GRPO - SFT significant above 0 on >= 200
                     # questions; (2) hallucination at most half SFT's, in-range accuracy not lower (paired).
                     "goal_gain": bool(in_range and len(in_range) >= 200 and diff_in.lo > 0),
                     "goal_hallucination": bool(halluc.accuracy <= sft_halluc.accuracy / 2 and in_range and diff_in.hi >= 0),
                     "stage_before": f"{result.before.n_correct}/{result.before.n}",
                     "stage_after": f"{result.after.n_correct}/{result.after.n}", "seconds": time.time() - started})
        print(f"seed {seed}: {score.describe()}; GRPO - SFT {diff.describe('SFT', 'GRPO')}; "
              + (f"in the training range {score_in.describe()}, GRPO - SFT {diff_in.describe('SFT', 'GRPO')}; " if in_range else "") +
              f"hallucinated {halluc.describe()} (SFT {sft_halluc.accuracy:.1%}); "
              f"the stage's own check {rows[-1]['stage_before']} -> {rows[-1]['stage_after']} "
              f"({rows[-1]['seconds']:.0f} s); goals: gain {'PASS' if rows[-1]['goal_gain'] else 'FAIL'}, "
              f"hallucination {'PASS' if rows[-1]['goal_hallucination'] else 'FAIL'}", flush=True)

    accs, diffs = [r["accuracy"] for r in rows], [r["diff"] for r in rows]
    accs_in = [r["in_range_accuracy"] for r in rows if "in_range_accuracy" in r]

    def sd(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else float("nan")

    summary = {"sft_accuracy": before.accuracy, "n_questions": before.n, "seeds": rows,
               "sft_hallucination": sft_halluc.accuracy, "sft_hallucination_lo": sft_halluc.accuracy_lo,
               "sft_hallucination_hi": sft_halluc.accuracy_hi, "sft_abstained": sum(a for _, a in sft_answers.values()),
               "accuracy_mean": statistics.fmean(accs), "accuracy_sd": sd(accs),
               "diff_mean": statistics.fmean(diffs), "diff_sd": sd(diffs)}
    if accs_in:
        summary |= {"sft_in_range_accuracy": before_in.accuracy, "in_range_n": before_in.n,
                    "in_range_accuracy_mean": statistics.fmean(accs_in), "in_range_accuracy_sd": sd(accs_in)}
    print(f"\nGRPO over {len(rows)} seeds: accuracy {summary['accuracy_mean']:.3f} ± {summary['accuracy_sd']:.3f} (sd), "
          f"SFT {before.accuracy:.3f}; GRPO - SFT {summary['diff_mean'] * 100:+.1f} ± {summary['diff_sd'] * 100:.1f} pts")
    if accs_in:
        print(f"in the training range ({before_in.n} questions): GRPO {summary['in_range_accuracy_mean']:.3f} ± "
              f"{summary['in_range_accuracy_sd']:.3f} (sd), SFT {before_in.accuracy:.3f}")
    if len(rows) < 3:
        print("fewer than 3 seeds: the sd says little; run --seeds 0 1 2 (or more)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
