"""How often does the scaling flow's 95% interval hold the run it predicts? Synthetic sweeps of the preset's design.

    .venv/bin/python bench/scaling_coverage.py --points work/scale/latest/points.json --replicates 30

Takes a finished sweep's points (`points.json`), fits its law once and uses it as the truth: each replicate draws
every point's bits per byte as that law times exp(noise), with noise of the sd of the sweep's own log residuals, fits
the replicate as the flow does (models/scaling_bootstrap.py, residual bootstrap) and predicts the run at `--factor` x
the largest budget (the law's best member there, as the flow chooses it), then checks whether one more noisy run of it
lies in the new-run interval. The baseline, measured on the same replicates, resamples runs within each budget instead
(docs/experiments/2026-12-05-scaling-sweep-trials.md). Prints, for both: coverage (with its Wilson interval), the
median half-width and the median error of the prediction against the truth.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.scaling import fit_loss_law, six_n  # noqa: E402
from models.scaling_bootstrap import LEVEL, bootstrap  # noqa: E402
from tasks.eval.intervals import wilson_interval  # noqa: E402


def case_interval(sb, n, d, y, budgets, at_n, at_d, resamples, rng):
    """The baseline: the new-run interval of `sb`'s fit (all runs, the same law and scaled residuals) with runs
    resampled within each budget."""
    law = sb.law
    groups = [np.flatnonzero(budgets == b) for b in np.unique(budgets)]
    samples = []
    for _ in range(resamples):
        idx = np.concatenate([rng.choice(g, size=len(g)) for g in groups])
        try:
            fit = fit_loss_law(n[idx], d[idx], y[idx], start=law)
        except ValueError:
            continue
        if fit.alpha > 0 and fit.beta > 0:
            samples.append(fit.loss(at_n, at_d))
    tail = 100 * (1 - LEVEL) / 2
    return np.percentile(np.outer(samples, np.exp(sb.log_residuals)).ravel(), [tail, 100 - tail])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=Path, required=True, help="a sweep's points.json (work/scale/<key>/points.json)")
    ap.add_argument("--replicates", type=int, default=30)
    ap.add_argument("--resamples", type=int, default=200, help="bootstrap resamples per replicate (the flow's default)")
    ap.add_argument("--factor", type=float, default=4.0,
                    help="without a prediction.json beside the points: the predicted run's budget / the largest swept")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    points = json.loads(args.points.read_text())
    c, n, d, y = (np.array([p[k] for p in points], float) for k in ("budget", "n_params", "tokens", "final_val_bpb"))
    truth = fit_loss_law(n, d, y)
    noise = float(np.std(np.log(y) - np.log(truth.loss(n, d)), ddof=5))
    prediction = args.points.parent / "prediction.json"
    if prediction.is_file():  # the run the flow predicted and trained
        chosen = json.loads(prediction.read_text())
        at_n, at_d = float(chosen["n_params"]), float(chosen["tokens"])
    else:  # the law's best of the swept sizes at factor x the largest budget, C = 6 N D
        budget = args.factor * c.max()
        at_n = float(min(np.unique(n), key=lambda m: truth.loss(m, budget / (6 * m))))
        at_d = budget / (6 * at_n)
    true_loss = float(truth.loss(at_n, at_d))
    print(f"{len(y)} points, truth {truth}; noise sd {noise:.4f}; predicted run N={at_n:,.0f} D={at_d:,.0f}: "
          f"true {true_loss:.4f} bits/byte; {args.replicates} replicates x {args.resamples} resamples")

    rng = np.random.default_rng(args.seed)
    rows = {"residuals (the flow)": [], "runs within budgets (before)": []}
    started = time.monotonic()
    for r in range(args.replicates):
        ys = truth.loss(n, d) * np.exp(rng.normal(0.0, noise, len(y)))
        new_run = true_loss * math.exp(rng.normal(0.0, noise))
        sb = bootstrap(c, n, d, ys, flops_per_token=six_n, resamples=args.resamples, seed=r)
        pred = sb.predict(at_n, at_d, new_run=True)
        low, high = case_interval(sb, n, d, ys, c, at_n, at_d, args.resamples, np.random.default_rng(r))
        for key, (lo, hi) in zip(rows, [(pred.low, pred.high), (low, high)]):
            rows[key].append((lo <= new_run <= hi, (hi - lo) / 2 / pred.loss, pred.loss / true_loss - 1))
        print(f"  replicate {r + 1}/{args.replicates} ({time.monotonic() - started:.0f}s)", end="\r", flush=True)
    print()
    print("| bootstrap | covers the new run | median half-width | median abs error of the prediction |")
    print("|---|---:|---:|---:|")
    for key, got in rows.items():
        hits = sum(g[0] for g in got)
        lo, hi = wilson_interval(hits, len(got))
        print(f"| {key} | {hits}/{len(got)} ({hits / len(got):.0%} [{lo:.0%}, {hi:.0%}]) | "
              f"{np.median([g[1] for g in got]):.1%} | {np.median([abs(g[2]) for g in got]):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
