"""Does a model know when it is wrong? Abstention by a threshold on its own answer confidence, from two eval.json files.

    .venv/bin/python bench/abstain_threshold.py --sft work/eval/<sft key>/eval.json \
        --policy work/eval/<grpo key>/eval.json [--thresholds 0.3 0.4 0.5]

A diagnostic for GRPO's abstention goal (bench/grpo_seeds.py's goal 2: the policy hallucinating at most half as often
as SFT, without in-range accuracy falling), not a way the models answer: the evaluation's greedy answers, each with
its confidence (the probability the model gave its answer's tokens), are read back, and every answer under a threshold
tau is counted as an abstention. tau = abstain / right reward is where answering stops paying for a calibrated model
(right 1 > abstain 0.3 > wrong 0 gives 0.3; right 1, abstain 0, wrong -1 gives 0.5). Per tau and model it prints the
hallucination rate (wrong and not abstained, of all questions) with its Wilson interval and the in-range accuracy with
the paired difference against SFT's own answers; then how well confidence separates right from wrong in-range answers
(AUROC), and the lowest tau at which the policy would halve its hallucination rate, chosen on these very questions (so
an upper bound, not a result). If that tau costs in-range accuracy, no threshold on the model's confidence can meet
the goal; if it does not, the signal is there and what is missing is a policy that acts on it by itself.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tasks.eval.abstention import abstention_report
from tasks.eval.intervals import paired_difference


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft", type=Path, required=True, help="the SFT model's eval.json (work/eval/<key>/eval.json)")
    p.add_argument("--policy", type=Path, required=True, help="the policy's eval.json (GRPO's), on the same questions")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.4, 0.5],
                   help="confidence thresholds tau to try (default 0.3 0.4 0.5)")
    return p.parse_args(argv)


def answers(path: Path) -> dict[str, dict]:
    """The eval.json's answer records by question; a clear error when it has none."""
    try:
        records = json.loads(path.read_text(encoding="utf-8"))["answers"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{path}: not an eval.json with answer records ({e}); pass work/eval/<key>/eval.json") from None
    return {a["question"]: a for a in records}


def abstains(a: dict, tau: float) -> bool:
    """Abstained, or answered (a number or not) with a confidence under tau."""
    return bool(a["abstained"]) or a["confidence"] < tau


def outcome(model: dict[str, dict], tau: float, in_range: list[str]) -> tuple:
    """(hallucination Proportion over all questions, in-range right flags) with answers under tau abstained."""
    abstained = {q: abstains(a, tau) for q, a in model.items()}
    right = {q: bool(a["correct"]) and not abstained[q] for q, a in model.items()}
    report = abstention_report(list(right.values()), list(abstained.values()))  # the evaluation's own shares
    return report.hallucination, [right[q] for q in in_range]


def auroc(right: list[float], wrong: list[float]) -> float:
    """P(a right answer's confidence > a wrong one's), ties half: how well confidence ranks right above wrong."""
    if not right or not wrong:
        return float("nan")
    return sum((r > w) + 0.5 * (r == w) for r in right for w in wrong) / (len(right) * len(wrong))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sft, policy = answers(args.sft), answers(args.policy)
    if set(sft) != set(policy):
        raise SystemExit(f"{args.sft} and {args.policy} asked different questions; evaluate both on the same set")
    in_range = [q for q, a in sft.items() if a.get("in_train_range")]
    sft_halluc, sft_right = outcome(sft, 0.0, in_range)
    policy_halluc, policy_right = outcome(policy, 0.0, in_range)
    print(f"{len(sft)} questions, {len(in_range)} in the training range. As they answer: SFT hallucinated "
          f"{sft_halluc.describe()}, in range {sum(sft_right)}/{len(in_range)}; the policy hallucinated "
          f"{policy_halluc.describe()}, in range {sum(policy_right)}/{len(in_range)}")

    def row(name: str, model: dict[str, dict], tau: float) -> bool:
        halluc, right = outcome(model, tau, in_range)
        diff = paired_difference(sft_right, right)
        goal = halluc.accuracy <= sft_halluc.accuracy / 2 and diff.hi >= 0
        print(f"  tau {tau:.4g} {name:6s}: hallucinated {halluc.describe()}; in range {sum(right)}/{len(in_range)}, "
              f"- SFT {diff.describe('SFT', f'{name}@{tau:.4g}')}" + ("; goal 2 met" if goal and name != "SFT" else ""))
        return goal

    for tau in args.thresholds:
        row("SFT", sft, tau)
        row("policy", policy, tau)
    for name, model in (("SFT", sft), ("policy", policy)):
        answered = [model[q] for q in in_range if not model[q]["abstained"]]
        score = auroc([a["confidence"] for a in answered if a["correct"]], [a["confidence"] for a in answered if not a["correct"]])
        print(f"{name}: confidence ranks its right in-range answers above its wrong ones with AUROC {score:.3f}")
    # Candidate thresholds: 0, and just above each answer's confidence (that answer and every one under it abstain).
    taus = [0.0, *(math.nextafter(c, math.inf) for c in sorted({a["confidence"] for a in policy.values()
                                                                   if not a["abstained"]}))]
    best = next((t for t in taus if outcome(policy, t, in_range)[0].accuracy <= sft_halluc.accuracy / 2), None)
    if best is None:
        print("no threshold halves the policy's hallucination rate")
    elif best == 0.0:
        print("the policy halves SFT's hallucination rate as it answers, without a threshold")
    elif not row("policy", policy, best):
        print("the lowest threshold that halves the hallucination rate costs in-range accuracy: goal 2 is out of reach "
              "for any threshold on the policy's confidence")
    else:
        print("(the line above picks tau on these questions: an upper bound, not a held-out result)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
